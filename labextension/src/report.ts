// The daemon's finished report (Go's attribution.Report, what GET
// /api/v1/notebooks serves and the server extension filters into State):
// its types, and the keys of each, listed at run time so that a test can
// hold the golden report (testdata/report/golden-report.json, written by
// Go) to them key by key. The types the widgets read (model.ts) are built
// from these: a field renamed in Go fails the golden test and tsc.
// Required fields are Go's always-written ones; optional those it leaves
// out when empty (omitempty).

/** The report's schema this extension reads (attribution.ReportSchema). */
export const REPORT_SCHEMA = 1;

/** The values of the report's enumerations, at run time (the golden test holds the report to them). */
export const HOLDER_KINDS = ['notebook', 'process', 'user'] as const;
export const COMPUTE_STATES = ['computing', 'idle', 'unknown'] as const;
export const STRAY_CAUSES = ['default_device', 'idle_child', 'visible_devices'] as const;
export const STRAY_EVIDENCE = ['framework', 'driver'] as const;
export const ALERT_KINDS = ['threshold', 'cull', 'left_running', 'oom'] as const;
/** How full a GPU is, as the daemon judges it (attribution.LevelFor): the colour of its bars. */
export const GPU_LEVELS = ['ok', 'warn', 'danger'] as const;
export type Level = (typeof GPU_LEVELS)[number];

/** NVML's per-process utilization, as the daemon charges it. */
export interface Utilization {
  sm_percent: number;
  memory_percent: number;
}

export interface GPUBytes {
  index: number;
  bytes: number;
  bytes_unknown?: boolean;
  /** Absent when the GPU cannot say: unknown, never 0. */
  utilization?: Utilization;
}

/** One holder of a GPU's memory: a notebook, a process of no kernel, or a user's together. */
export interface Holder {
  kind: (typeof HOLDER_KINDS)[number];
  name: string;
  user: string;
  bytes: number;
  kernel_id?: string;
  connection_file?: string;
  pid?: number;
  command?: string;
  notebooks?: number;
  processes?: number;
}

export interface ReportGPU {
  index: number;
  uuid: string;
  name: string;
  memory_total_bytes: number;
  memory_used_bytes: number;
  simulated: boolean;
  level: Level;
  /** The daemon's sentence for when the GPU's threshold alert ends: set while it is back under the threshold. */
  under_threshold?: string;
  notebook_bytes: number;
  other_bytes: number;
  free_bytes: number;
  utilization?: Utilization;
  utilization_missing?: string;
  holders?: Holder[];
  holders_by_user?: Holder[];
}

/** The daemon's verdict on a notebook's GPU work, and its hoarding. */
export interface Compute {
  state: (typeof COMPUTE_STATES)[number];
  reason?: string;
  last_computed_at?: string;
  hoarded_gib_hours?: number;
}

/** A (GPU, pid) of a notebook's tree holding memory with no framework memory there, as the daemon flags it. */
export interface StrayContext {
  gpu: number;
  pid: number;
  bytes: number;
  cause: (typeof STRAY_CAUSES)[number];
  label: string;
  why: string;
  avoid: string;
  evidence: (typeof STRAY_EVIDENCE)[number];
}

/** The kernel's server's view of its activity, and any planned cull. */
export interface Activity {
  execution_state: string;
  last_activity: string;
  idle_seconds: number;
  cull_at?: string;
  cull_action?: string;
}

export interface Pod {
  name: string;
  namespace: string;
  uid: string;
  container?: string;
  user?: string;
  server?: string;
}

/** A kernel's out-of-memory errors as the daemon recorded them. */
export interface OOMSummary {
  count: number;
  last_time: number;
  last_gpu?: number;
  last_requested_bytes: number;
  last_event: number;
  last_headline?: string;
}

export interface ReportNotebook {
  kernel_id: string;
  connection_file?: string;
  notebook: string;
  /** The name every face shows for the notebook (attribution.KernelName). */
  display_name: string;
  pids: number[];
  user: string;
  gpu_memory_bytes: number;
  peak_bytes?: number;
  per_gpu: GPUBytes[];
  processes: { pid: number; per_gpu: GPUBytes[] }[];
  pod?: Pod;
  activity?: Activity;
  stray_contexts?: StrayContext[];
  oom?: OOMSummary;
  /** Summed over its GPUs; absent when unknown. */
  utilization?: Utilization;
  compute?: Compute;
}

export interface OtherProcess {
  pid: number;
  user: string;
  command: string;
  per_gpu: GPUBytes[];
  pod?: Pod;
}

/** A process of a dead kernel's tree that reclaim left running. */
export interface LeftRunning {
  kernel_id: string;
  connection_file: string;
  notebook: string;
  user: string;
  pid: number;
  start_time: number;
  command: string;
  gpus: number[];
  bytes: number;
  reason: string;
  since: string;
  message: string;
}

/** One user's totals, as gpumem serve totals them. */
export interface UserUsage {
  user: string;
  notebooks: number;
  other_processes: number;
  notebook_bytes: number;
  other_bytes: number;
  gpu_memory_bytes: number;
  per_gpu: GPUBytes[];
  hoarded_gib_hours?: number;
}

export interface UserHoarding {
  user: string;
  gib_hours: number;
  window_seconds: number;
}

/**
 * An alert that stands, as gpumem serve wrote it (its id, kind and
 * sentence): the threshold's per GPU, culling's per kernel. The server
 * extension keeps those of this server's kernels, and lists only them in
 * kernels.
 */
export interface Alert {
  id: string;
  kind: (typeof ALERT_KINDS)[number];
  gpu: number;
  kernels: string[];
  user?: string;
  bytes: number;
  deadline?: string;
  action?: string;
  message: string;
  /** The daemon's line for a notification, where message is longer than a toast shows. */
  headline?: string;
}

export interface Report {
  schema: number;
  gpus: ReportGPU[];
  notebooks: ReportNotebook[];
  other: OtherProcess[];
  warnings?: string[];
  view?: 'own';
  left_running?: LeftRunning[];
  hoarding?: UserHoarding[];
  users?: UserUsage[];
  alerts?: Alert[];
}

/**
 * A type's keys at run time, and the shape of those that hold objects.
 * shape() takes them as an object literal of the type's keys: tsc fails
 * on a key missing from it, and on one the type does not have.
 */
export interface Shape {
  keys: readonly string[];
  /** The shape of the objects (or of the arrays' objects) a key holds. */
  nested: Record<string, Shape>;
}

type KeySet<T> = { [K in keyof Required<T>]: true };

function shape<T>(keys: KeySet<T>, nested: Record<string, Shape> = {}): Shape {
  return { keys: Object.keys(keys), nested };
}

const UTILIZATION = shape<Utilization>({ sm_percent: true, memory_percent: true });
const GPU_BYTES = shape<GPUBytes>({ index: true, bytes: true, bytes_unknown: true, utilization: true }, { utilization: UTILIZATION });
const HOLDER = shape<Holder>({
  kind: true,
  name: true,
  user: true,
  bytes: true,
  kernel_id: true,
  connection_file: true,
  pid: true,
  command: true,
  notebooks: true,
  processes: true
});
const POD = shape<Pod>({ name: true, namespace: true, uid: true, container: true, user: true, server: true });

/** The report's shape, every key of every type in it. */
export const REPORT_SHAPE: Shape = shape<Report>(
  {
    schema: true,
    gpus: true,
    notebooks: true,
    other: true,
    warnings: true,
    view: true,
    left_running: true,
    hoarding: true,
    users: true,
    alerts: true
  },
  {
    gpus: shape<ReportGPU>(
      {
        index: true,
        uuid: true,
        name: true,
        memory_total_bytes: true,
        memory_used_bytes: true,
        simulated: true,
        level: true,
        under_threshold: true,
        notebook_bytes: true,
        other_bytes: true,
        free_bytes: true,
        utilization: true,
        utilization_missing: true,
        holders: true,
        holders_by_user: true
      },
      { utilization: UTILIZATION, holders: HOLDER, holders_by_user: HOLDER }
    ),
    notebooks: shape<ReportNotebook>(
      {
        kernel_id: true,
        connection_file: true,
        notebook: true,
        display_name: true,
        pids: true,
        user: true,
        gpu_memory_bytes: true,
        peak_bytes: true,
        per_gpu: true,
        processes: true,
        pod: true,
        activity: true,
        stray_contexts: true,
        oom: true,
        utilization: true,
        compute: true
      },
      {
        per_gpu: GPU_BYTES,
        processes: shape<ReportNotebook['processes'][number]>({ pid: true, per_gpu: true }, { per_gpu: GPU_BYTES }),
        pod: POD,
        activity: shape<Activity>({ execution_state: true, last_activity: true, idle_seconds: true, cull_at: true, cull_action: true }),
        stray_contexts: shape<StrayContext>({
          gpu: true,
          pid: true,
          bytes: true,
          cause: true,
          label: true,
          why: true,
          avoid: true,
          evidence: true
        }),
        oom: shape<OOMSummary>({
          count: true,
          last_time: true,
          last_gpu: true,
          last_requested_bytes: true,
          last_event: true,
          last_headline: true
        }),
        utilization: UTILIZATION,
        compute: shape<Compute>({ state: true, reason: true, last_computed_at: true, hoarded_gib_hours: true })
      }
    ),
    other: shape<OtherProcess>({ pid: true, user: true, command: true, per_gpu: true, pod: true }, { per_gpu: GPU_BYTES, pod: POD }),
    left_running: shape<LeftRunning>({
      kernel_id: true,
      connection_file: true,
      notebook: true,
      user: true,
      pid: true,
      start_time: true,
      command: true,
      gpus: true,
      bytes: true,
      reason: true,
      since: true,
      message: true
    }),
    hoarding: shape<UserHoarding>({ user: true, gib_hours: true, window_seconds: true }),
    users: shape<UserUsage>(
      {
        user: true,
        notebooks: true,
        other_processes: true,
        notebook_bytes: true,
        other_bytes: true,
        gpu_memory_bytes: true,
        per_gpu: true,
        hoarded_gib_hours: true
      },
      { per_gpu: GPU_BYTES }
    ),
    alerts: shape<Alert>({
      id: true,
      kind: true,
      gpu: true,
      kernels: true,
      user: true,
      bytes: true,
      deadline: true,
      action: true,
      message: true,
      headline: true
    })
  }
);

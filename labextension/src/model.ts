// What the server extension sends (GET gpumem/api/v1/state) and the pure
// data shaping the widgets need: history merging, stacked plot data, alert
// and event selection. No attribution happens here: the daemon computes
// every figure. Unit-tested in model.test.ts.

import { baseName, formatBytes, formatPercent } from './format';

export interface GPUBytes {
  index: number;
  bytes: number;
  bytes_unknown?: boolean;
}

export interface GPU {
  index: number;
  uuid: string;
  name: string;
  memory_total_bytes: number;
  memory_used_bytes: number;
  simulated: boolean;
  notebook_bytes: number;
  other_bytes: number;
  free_bytes: number;
}

export interface Notebook {
  kernel_id: string;
  notebook: string;
  path: string;
  pids: number[];
  user: string;
  gpu_memory_bytes: number;
  peak_bytes?: number;
  per_gpu: GPUBytes[];
  processes: { pid: number; per_gpu: GPUBytes[] }[];
  /** The kernel's server's view of its activity, and any planned cull. */
  activity?: Activity;
}

export interface Activity {
  execution_state: string;
  last_activity: string;
  idle_seconds: number;
  cull_at?: string;
  cull_action?: string;
}

export interface OtherUser {
  user: string;
  notebooks: number;
  processes: number;
  bytes: number;
  per_gpu: GPUBytes[];
}

export interface Series {
  id: string;
  peak_bytes: number;
  peak_at: number;
  points: [number, number][];
}

export interface ReclaimEvent {
  seq: number;
  time: number;
  kind: string;
  kernel_id: string;
  notebook: string;
  user: string;
  reason: string;
  processes: number;
  bytes: number;
}

/**
 * Which daemon serves this server, as the server extension's supervisor
 * says it: started by this server, shared (started outside it), or not
 * running and why. text is the sentence to show; the rest is for tests and
 * styling.
 */
export interface DaemonStatus {
  case: 'started' | 'shared' | 'not_running';
  pid: number;
  user: string;
  version: string;
  text: string;
}

export interface State {
  status: 'ok';
  daemon?: DaemonStatus;
  now: number;
  step_seconds: number;
  alert_threshold: number;
  gpus: GPU[];
  notebooks: Notebook[];
  others: OtherUser[];
  warnings: string[];
  series: { gpus: Series[]; notebooks: Series[] };
  events: ReclaimEvent[];
  last_event: number;
}

export interface Unavailable {
  status: 'no_daemon' | 'error';
  message: string;
  daemon?: DaemonStatus;
}

export type Reply = State | Unavailable;

/** The plot's window, in seconds. */
export const WINDOW_SECONDS = 15 * 60;

/**
 * History keeps the last WINDOW_SECONDS of points per series, merged from
 * the incremental replies (each asks for points since the last reply).
 */
export class History {
  readonly notebooks = new Map<string, Map<number, number>>();
  readonly gpus = new Map<string, Map<number, number>>();
  now = 0;
  /** The newest point's time: the daemon's clock runs ahead of its last sample. */
  last = 0;

  /** Merges a reply's series and drops points older than the window. */
  merge(state: State): void {
    this.now = Math.max(this.now, state.now);
    const add = (into: Map<string, Map<number, number>>, series: Series[]) => {
      for (const s of series) {
        let m = into.get(s.id);
        if (!m) {
          m = new Map();
          into.set(s.id, m);
        }
        for (const [t, b] of s.points) {
          m.set(t, b);
          this.last = Math.max(this.last, t);
        }
      }
    };
    add(this.notebooks, state.series.notebooks);
    add(this.gpus, state.series.gpus);
    const horizon = this.now - WINDOW_SECONDS;
    for (const all of [this.notebooks, this.gpus]) {
      for (const [id, m] of all) {
        for (const t of m.keys()) {
          if (t <= horizon) {
            m.delete(t);
          }
        }
        if (m.size === 0) {
          all.delete(id);
        }
      }
    }
  }
}

/** Data for one GPU's stacked plot, in uPlot's column layout. */
export interface Stacked {
  /** Times (unix seconds), one a step, oldest first. */
  times: number[];
  /** Per notebook, the cumulative sum up to and including it: the upper edge of its band. */
  stacks: { kernelId: string; label: string; values: (number | null)[] }[];
}

/**
 * Stacks the notebooks' series on a common time axis (every step of the
 * window up to now): each notebook's band sits on the ones before it, the
 * biggest now at the bottom. A missing point counts 0 so that bands stay
 * contiguous. Only notebooks that hold memory on gpuIndex now (or whose
 * history shows memory) are stacked; GPUs are not split per notebook by the
 * daemon's history, so a notebook's whole figure is drawn on each GPU it
 * uses.
 */
export function stackNotebooks(
  hist: History,
  notebooks: Notebook[],
  gpuIndex: number,
  step: number,
  window = WINDOW_SECONDS
): Stacked {
  const st = Math.max(1, step);
  const end = hist.last || hist.now;
  const times: number[] = [];
  for (let t = end - window + st; t <= end; t += st) {
    times.push(t);
  }
  const onGPU = notebooks.filter(
    nb => nb.per_gpu.some(g => g.index === gpuIndex) || (nb.per_gpu.length === 0 && gpuIndex === 0)
  );
  onGPU.sort((a, b) => b.gpu_memory_bytes - a.gpu_memory_bytes || a.kernel_id.localeCompare(b.kernel_id));
  const base = times.map(() => 0);
  const stacks: Stacked['stacks'] = [];
  for (const nb of onGPU) {
    const pts = hist.notebooks.get(nb.kernel_id);
    const values = times.map((t, i) => {
      base[i] += pts?.get(t) ?? 0;
      return base[i];
    });
    stacks.push({ kernelId: nb.kernel_id, label: notebookLabel(nb), values });
  }
  return { times, stacks };
}

/** The name a notebook goes by: its file name, or its kernel. */
export function notebookLabel(nb: { notebook: string; path?: string; kernel_id: string }): string {
  const p = nb.path || nb.notebook;
  return p ? baseName(p) : `kernel ${nb.kernel_id.slice(0, 8)}`;
}

/** The notebook of a kernel, if the state lists it. */
export function notebookOf(state: State, kernelId: string | undefined): Notebook | undefined {
  return kernelId ? state.notebooks.find(nb => nb.kernel_id === kernelId) : undefined;
}

/** The GPU a notebook uses most (for its status bar bar), else the first GPU. */
export function mainGPU(state: State, nb: Notebook | undefined): GPU | undefined {
  if (nb && nb.per_gpu.length) {
    const top = [...nb.per_gpu].sort((a, b) => b.bytes - a.bytes)[0];
    const g = state.gpus.find(g => g.index === top.index);
    if (g) {
      return g;
    }
  }
  return state.gpus[0];
}

/** A GPU over the alert threshold, with the holders a notification names. */
export interface Alert {
  key: string;
  gpu: GPU;
  message: string;
  /** This server's notebooks on that GPU: the "free cache" button frees these. */
  ownKernels: string[];
}

/**
 * The GPUs at or over the threshold, each with a message naming the biggest
 * holders (this server's notebooks by name, other users by user). key is
 * per GPU: a caller shows an alert once until its GPU falls back under.
 */
export function alerts(state: State, holders = 3): Alert[] {
  const out: Alert[] = [];
  if (!(state.alert_threshold > 0)) {
    return out;
  }
  for (const g of state.gpus) {
    if (!(g.memory_total_bytes > 0) || g.memory_used_bytes < state.alert_threshold * g.memory_total_bytes) {
      continue;
    }
    const hs: { name: string; bytes: number }[] = [];
    const own: string[] = [];
    for (const nb of state.notebooks) {
      const b = nb.per_gpu.find(p => p.index === g.index)?.bytes ?? 0;
      if (b > 0) {
        hs.push({ name: notebookLabel(nb), bytes: b });
        own.push(nb.kernel_id);
      }
    }
    for (const u of state.others) {
      const b = u.per_gpu.find(p => p.index === g.index)?.bytes ?? 0;
      if (b > 0) {
        hs.push({ name: `user ${u.user}`, bytes: b });
      }
    }
    hs.sort((a, b) => b.bytes - a.bytes || a.name.localeCompare(b.name));
    const names = hs
      .slice(0, holders)
      .map(h => `${h.name} ${formatBytes(h.bytes)}`)
      .join(', ');
    out.push({
      key: `gpu-${g.index}`,
      gpu: g,
      ownKernels: own,
      message:
        `GPU ${g.index} (${g.name}) is ${formatPercent(g.memory_used_bytes, g.memory_total_bytes)} full: ` +
        `${formatBytes(g.memory_used_bytes)} of ${formatBytes(g.memory_total_bytes)}` +
        (names ? `. Biggest: ${names}.` : '.')
    });
  }
  return out;
}

/**
 * Which alerts to show now: those whose GPU was not already alerting in the
 * previous reply. shown is updated: a GPU that falls back under the
 * threshold may alert again later.
 */
export function newAlerts(current: Alert[], shown: Set<string>): Alert[] {
  const now = new Set(current.map(a => a.key));
  for (const k of [...shown]) {
    if (!now.has(k)) {
      shown.delete(k);
    }
  }
  const fresh = current.filter(a => !shown.has(a.key));
  for (const a of fresh) {
    shown.add(a.key);
  }
  return fresh;
}

/** The tooltip's lines for a notebook: per GPU, then per process. */
export function tooltipLines(state: State, nb: Notebook | undefined): string[] {
  const lines: string[] = [];
  if (!nb) {
    lines.push('This notebook has no kernel that gpumem serve follows yet.');
  } else {
    lines.push(`${notebookLabel(nb)}: ${formatBytes(nb.gpu_memory_bytes)} on the GPU (driver's figure, children included)`);
    if (nb.peak_bytes) {
      lines.push(`peak since kernel start: ${formatBytes(nb.peak_bytes)}`);
    }
    for (const pg of nb.per_gpu) {
      const g = state.gpus.find(x => x.index === pg.index);
      lines.push(
        `GPU ${pg.index}${g ? ` (${g.name})` : ''}: ${formatBytes(pg.bytes)}${pg.bytes_unknown ? ' + unknown' : ''}`
      );
    }
    if (nb.processes.length > 1) {
      lines.push(`${nb.processes.length} processes: ` + nb.processes.map(p => `pid ${p.pid}`).join(', '));
    }
  }
  for (const g of state.gpus) {
    lines.push(
      `GPU ${g.index} total: ${formatBytes(g.memory_used_bytes)} / ${formatBytes(g.memory_total_bytes)}` +
        (g.simulated ? ' (simulated)' : '')
    );
  }
  return lines;
}

/** Framework lines from the kernel's %gpumem summary data. */
export function frameworkLines(summary: unknown): string[] {
  const fws = (summary as { frameworks?: unknown })?.frameworks;
  if (!Array.isArray(fws)) {
    return [];
  }
  const lines: string[] = [];
  for (const fw of fws as { label?: string; name?: string; state?: string; devices?: unknown[] }[]) {
    const label = fw.label || fw.name || '?';
    const devs = Array.isArray(fw.devices) ? fw.devices : [];
    if (!devs.length) {
      if (fw.state && fw.state !== 'absent') {
        lines.push(`${label}: ${fw.state}`);
      }
      continue;
    }
    for (const d of devs as { device?: string; used?: number; held?: number | null }[]) {
      const held = typeof d.held === 'number' ? `, holds ${formatBytes(d.held)}` : '';
      lines.push(`${label} ${d.device ?? ''}: uses ${formatBytes(d.used ?? 0)}${held}`.replace('  ', ' '));
    }
  }
  return lines;
}

/** One row of the Variables table. */
export interface VarRow {
  name: string;
  type: string;
  device: string;
  bytes: number;
  hidden: boolean;
}

/** The rows of %gpumem vars's data, largest first. */
export function varRows(vars: unknown): VarRow[] {
  const rows = (vars as { rows?: unknown })?.rows;
  if (!Array.isArray(rows)) {
    return [];
  }
  return (rows as Record<string, unknown>[])
    .map(r => ({
      name: String(r.name ?? ''),
      type: String(r.type ?? ''),
      device: String(r.device ?? ''),
      bytes: Number(r.bytes ?? 0),
      hidden: Boolean(r.hidden)
    }))
    .sort((a, b) => b.bytes - a.bytes);
}

export interface CullWarning {
  key: string;
  kernelId: string;
  message: string;
}

const cullVerbs: Record<string, string> = {
  report: 'be reported as an idle GPU holder',
  free: 'have its GPU caches freed',
  shutdown: 'be shut down'
};

/**
 * The warnings gpumem serve's GPU-aware culling stands for this server's
 * notebooks: idle kernels holding GPU memory, and what will be done when.
 * key changes with each warning, so a caller shows each one once.
 */
export function cullWarnings(state: State): CullWarning[] {
  const out: CullWarning[] = [];
  for (const nb of state.notebooks) {
    const a = nb.activity;
    if (!a?.cull_at) {
      continue;
    }
    const at = new Date(a.cull_at);
    const idle = formatDuration(a.idle_seconds);
    const verb = cullVerbs[a.cull_action ?? ''] ?? 'be culled';
    out.push({
      key: `${nb.kernel_id}@${a.cull_at}`,
      kernelId: nb.kernel_id,
      message:
        `${notebookLabel(nb)} holds ${formatBytes(nb.gpu_memory_bytes)} and has been idle ${idle}; ` +
        `it will ${verb} at ${at.toLocaleTimeString()} unless used.`
    });
  }
  return out;
}

/** A duration for people: "3 h 5 min", "12 min", "40 s". */
export function formatDuration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  if (h > 0) {
    return m > 0 ? `${h} h ${m} min` : `${h} h`;
  }
  if (m > 0) {
    return `${m} min`;
  }
  return `${s} s`;
}

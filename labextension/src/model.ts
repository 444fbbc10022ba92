// What the server extension sends (GET gpumem/api/v1/state) and the pure
// data shaping the widgets need: history merging, stacked plot data, which
// of the daemon's alerts are new or gone, event selection. No attribution
// happens here: the daemon computes every figure and sentence. Unit-tested
// in model.test.ts.

import { plainTrans, Trans } from './format';
import { Alert, LeftRunning, ReportGPU, ReportNotebook, UserUsage } from './report';

export type { Activity, Alert, Compute, GPUBytes, Level, LeftRunning, StrayContext, Utilization } from './report';

/** A GPU as the server extension passes it on: the report's, without its holders (they name other servers' notebooks). */
export type GPU = Omit<ReportGPU, 'holders' | 'holders_by_user'>;

/** A notebook of this server's, as the report has it, with its path relative to the server's root (for "Open"). */
export interface Notebook extends ReportNotebook {
  path: string;
}

/** One user's totals beyond this server's kernels, as gpumem serve totals them. */
export type OtherUser = UserUsage;

export interface Series {
  id: string;
  /** A notebook's series on one GPU: that GPU's index; absent for its total. */
  gpu?: number;
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
  /** A process left running ("left_running"): what ending it names. */
  pid?: number;
  /** The daemon's sentence: of a reclaim ("reclaim") or a process left running. */
  message?: string;
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
  /** notebook_sm: each notebook's SM % (summed over its GPUs), no point where unknown. */
  series: { gpus: Series[]; notebooks: Series[]; notebook_sm?: Series[] };
  events: ReclaimEvent[];
  last_event: number;
  left_running?: LeftRunning[];
  /** The alerts that stand (gpumem serve's), this server's kernels' only. */
  alerts?: Alert[];
}

export interface Unavailable {
  status: 'no_daemon' | 'error';
  message: string;
  daemon?: DaemonStatus;
}

export type Reply = State | Unavailable;

/** What the daemon keeps at its sampling interval: 15 minutes. */
export const FINE_WINDOW = 15 * 60;
/** The plot windows a user may choose, in seconds: 5 min, 15 min, 1 h, 24 h. */
export const WINDOWS = [5 * 60, 15 * 60, 60 * 60, 24 * 60 * 60];
/** The shortest span a plot shows, however little history there is. */
export const MIN_SPAN = 60;

type Points = Map<number, number>;

/**
 * History keeps the last windowSeconds of points per series, merged from
 * the incremental replies (each asks for points since the last reply):
 * the GPUs' used memory, each notebook's total, each notebook's bytes on
 * each GPU (keyed "kernel/gpu") and each notebook's SM %, all as the
 * daemon sent them.
 */
export class History {
  readonly notebooks = new Map<string, Points>();
  readonly notebookGpus = new Map<string, Points>();
  readonly gpus = new Map<string, Points>();
  /** Per notebook, its SM % summed over its GPUs; no point where unknown. */
  readonly sm = new Map<string, Points>();
  now = 0;
  /** The newest point's time: the daemon's clock runs ahead of its last sample. */
  last = 0;
  /** The points' spacing, in seconds (the daemon's step_seconds). */
  step = 1;

  constructor(readonly windowSeconds = FINE_WINDOW) {}

  /** Merges a reply's series and drops points older than the window. */
  merge(state: State): void {
    this.now = Math.max(this.now, state.now);
    this.step = Math.max(1, state.step_seconds || 1);
    const add = (into: Map<string, Points>, key: string, points: [number, number][]) => {
      let m = into.get(key);
      if (!m) {
        m = new Map();
        into.set(key, m);
      }
      for (const [t, b] of points) {
        m.set(t, b);
        this.last = Math.max(this.last, t);
      }
    };
    for (const s of state.series.notebooks) {
      if (s.gpu === undefined) {
        add(this.notebooks, s.id, s.points);
      } else {
        add(this.notebookGpus, gpuKey(s.id, s.gpu), s.points);
      }
    }
    for (const s of state.series.gpus) {
      add(this.gpus, s.id, s.points);
    }
    for (const s of state.series.notebook_sm ?? []) {
      add(this.sm, s.id, s.points);
    }
    const horizon = this.now - this.windowSeconds;
    for (const all of [this.notebooks, this.notebookGpus, this.gpus, this.sm]) {
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

  /** The oldest point's time, or 0 without any. */
  first(): number {
    let first = 0;
    for (const all of [this.notebooks, this.notebookGpus, this.gpus]) {
      for (const m of all.values()) {
        for (const t of m.keys()) {
          first = first === 0 ? t : Math.min(first, t);
        }
      }
    }
    return first;
  }
}

/** The key of a notebook's series on one GPU. */
export function gpuKey(kernelId: string, gpu: number): string {
  return `${kernelId}/${gpu}`;
}

/**
 * The plot's time range: the chosen window, or less while the history is
 * shorter, so that a fresh session fills the plot instead of being a
 * sliver at its right edge; never under MIN_SPAN.
 */
export function plotRange(first: number, last: number, windowSeconds: number): [number, number] {
  if (!(last > 0)) {
    return [0, 0];
  }
  const from = first > 0 ? Math.max(last - windowSeconds, Math.min(first, last - MIN_SPAN)) : last - MIN_SPAN;
  return [from, last];
}

/** Data for one GPU's plot, in uPlot's column layout. */
export interface Stacked {
  /** Times (unix seconds), one a step, oldest first. */
  times: number[];
  /** Per notebook, the cumulative sum up to and including it: the upper edge of its band. */
  stacks: { kernelId: string; label: string; values: (number | null)[] }[];
  /** The GPU's used memory (every process's, as the driver counts it), or null where unknown. */
  used: (number | null)[];
  /** The highest figure drawn: the axis's top. */
  top: number;
}

/**
 * One GPU's plot: this server's notebooks stacked on a common time axis
 * (every step of the range), each band that notebook's bytes on this GPU
 * only, the biggest now at the bottom, and the GPU's used memory as a
 * line above them (other users and processes are the gap). A missing
 * point counts 0 so that bands stay contiguous; before the oldest point
 * there is nothing (null). Every figure is the
 * daemon's: nothing is attributed here.
 */
export function stackNotebooks(hist: History, notebooks: Notebook[], gpuIndex: number, windowSeconds = FINE_WINDOW): Stacked {
  const st = Math.max(1, hist.step);
  const [from, to] = plotRange(hist.first(), hist.last || hist.now, windowSeconds);
  const times: number[] = [];
  for (let t = to; t >= from && to > 0; t -= st) {
    times.push(t);
  }
  times.reverse();
  const bytesOn = (nb: Notebook) => nb.per_gpu.find(g => g.index === gpuIndex)?.bytes ?? 0;
  const onGPU = notebooks.filter(nb => bytesOn(nb) > 0 || hist.notebookGpus.has(gpuKey(nb.kernel_id, gpuIndex)));
  onGPU.sort((a, b) => bytesOn(b) - bytesOn(a) || a.kernel_id.localeCompare(b.kernel_id));
  // Before the oldest point the daemon sent there is no figure at all:
  // drawn as nothing, never as 0.
  const first = hist.first();
  const known = times.map(t => first > 0 && t >= first);
  const base = times.map(() => 0);
  let top = 0;
  const stacks: Stacked['stacks'] = [];
  for (const nb of onGPU) {
    const pts = hist.notebookGpus.get(gpuKey(nb.kernel_id, gpuIndex));
    const values = times.map((t, i) => {
      if (!known[i]) {
        return null;
      }
      base[i] += pts?.get(t) ?? 0;
      top = Math.max(top, base[i]);
      return base[i];
    });
    stacks.push({ kernelId: nb.kernel_id, label: nb.display_name, values });
  }
  const gpuPts = hist.gpus.get(String(gpuIndex));
  const used = times.map((t, i) => {
    const v = gpuPts?.get(t);
    if (v === undefined || !known[i]) {
      return null;
    }
    top = Math.max(top, v);
    return v;
  });
  return { times, stacks, used, top };
}

/**
 * A sparkline's SVG path: points (unix seconds, figure) within [from, to]
 * scaled into width x height, 0 at the bottom and max at the top. With gap
 * (seconds), points further apart than it are not joined: a time without
 * a figure (utilization unknown) stays a gap, never a line through it.
 */
export function sparkPath(
  points: Points | undefined,
  from: number,
  to: number,
  width: number,
  height: number,
  max: number,
  gap = Infinity
): string {
  if (!points || !(to > from) || !(max > 0)) {
    return '';
  }
  const xs = [...points.keys()].filter(t => t >= from && t <= to).sort((a, b) => a - b);
  return xs
    .map((t, i) => {
      const x = ((t - from) / (to - from)) * width;
      const y = height - (Math.min(points.get(t) ?? 0, max) / max) * height;
      const pen = i > 0 && t - xs[i - 1] <= gap ? 'L' : 'M';
      return `${pen}${x.toFixed(1)},${y.toFixed(1)}`;
    })
    .join(' ');
}

/** The notebook of a kernel, if the state lists it. */
export function notebookOf(state: State | null | undefined, kernelId: string | undefined): Notebook | undefined {
  return kernelId ? state?.notebooks.find(nb => nb.kernel_id === kernelId) : undefined;
}

/**
 * What a message names a kernel by: its display name, the daemon's, while
 * the state lists it. An event (a memory snapshot, an out-of-memory
 * report) outlives its kernel in the report, and names only the notebook
 * it came from: then that notebook's file name, else the kernel's id
 * start, as the daemon would name it (attribution.KernelName).
 */
export function kernelLabel(state: State | null | undefined, kernelId: string, notebook = '', trans: Trans = plainTrans): string {
  const nb = notebookOf(state, kernelId);
  if (nb) {
    return nb.display_name;
  }
  return notebook ? notebook.slice(notebook.lastIndexOf('/') + 1) : trans.__('kernel %1', kernelId.slice(0, 8));
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

/** What a notification says of an alert: the daemon's headline, or its message. */
export function alertText(a: Alert): string {
  return a.headline || a.message;
}

/** The kinds a notification shows; a process left running and an out-of-memory error are the events'. */
const TOASTED = new Set(['threshold', 'cull']);

/**
 * What changed in the alerts since the last reply: fresh are the alerts
 * not shown yet (each id once), changed those shown whose sentence the
 * daemon has rewritten since (a GPU's figure moved: the toast says the
 * new one), gone the ids shown that the daemon no longer holds. shown
 * (id -> alert) is updated.
 */
export function alertChanges(alerts: Alert[] | undefined, shown: Map<string, Alert>): { fresh: Alert[]; changed: Alert[]; gone: Alert[] } {
  const current = (alerts ?? []).filter(a => TOASTED.has(a.kind));
  const ids = new Set(current.map(a => a.id));
  const gone = [...shown.values()].filter(a => !ids.has(a.id));
  for (const a of gone) {
    shown.delete(a.id);
  }
  const fresh = current.filter(a => !shown.has(a.id));
  const changed = current.filter(a => {
    const was = shown.get(a.id);
    return was !== undefined && alertText(was) !== alertText(a);
  });
  for (const a of [...fresh, ...changed]) {
    shown.set(a.id, a);
  }
  return { fresh, changed, gone };
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

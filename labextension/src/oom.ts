// Out-of-memory errors and memory snapshots, as gpumem serve computes them:
// the event's types, the pure shaping of what the panel shows (unit-tested
// in oom.test.ts), and the DOM of the report and of a snapshot. Nothing is
// derived here that the daemon did not say: the holders (the report's
// ranked holders, their names too), the kernel's name, the cache's figure,
// the advice and the headline are its own. Self-contained, so that the
// panel's layout can change around it.

import type uPlot from 'uplot';

import { el } from './dom';
import { axisSize, canvasMeasure, currentTheme } from './plot';
import { listNode } from './view';
import { formatBytes, formatDuration, plainTrans, Trans } from './format';
import type { Holder } from './report';

/**
 * One of the GPU's holders as the event shows it: the report's (its name
 * what to show: "this kernel" for the event's own, "user b" for another
 * user in a user's view) and what the event adds.
 */
export interface OOMHolder extends Holder {
  self?: boolean;
  state?: string;
  idle_seconds?: number;
  pids?: number[];
}

export interface OOMEvent {
  seq: number;
  time: number;
  kernel_id: string;
  connection_file: string;
  notebook: string;
  /** How a sentence names the kernel: its notebook's file name, else the kernel. */
  name: string;
  user: string;
  framework: string;
  error: string;
  message: string;
  requested_bytes: number;
  cell: { execution_count?: number; line?: number; source?: string };
  kernel: {
    allocated_bytes: number;
    reserved_bytes: number;
    releasable_bytes: number;
    fragmented_bytes: number;
    /** The cache beyond live tensors, as the daemon computed it. */
    cached_bytes: number;
    ipython_bytes: number;
    ipython_refs?: string[];
    traceback_bytes: number;
  };
  gpu: { index: number; name: string; total_bytes: number; used_bytes: number; free_bytes: number; simulated: boolean } | null;
  holders: OOMHolder[];
  holders_by_user?: Holder[];
  /** When the daemon read the figures (unix milliseconds). */
  sampled_at: number;
  advice: string;
  headline: string;
  view?: string;
}

/** An event of the daemon's log with what it carries for these kinds. */
export interface LogEvent {
  seq: number;
  kind: string;
  kernel_id: string;
  notebook: string;
  reason: string;
  oom?: OOMEvent;
}

/** The out-of-memory events among new events, each once (by sequence number). */
export function newOOMs(events: LogEvent[], seen: Set<number>): OOMEvent[] {
  const out: OOMEvent[] = [];
  for (const ev of events) {
    if (ev.kind === 'oom' && ev.oom && !seen.has(ev.seq)) {
      seen.add(ev.seq);
      out.push(ev.oom);
    }
  }
  return out;
}

/** One line per fact of the report, in the panel's order. */
export function reportLines(ev: OOMEvent, trans: Trans = plainTrans): string[] {
  const lines: string[] = [];
  const c = ev.cell || {};
  let where = ev.name;
  if (c.execution_count) {
    where = c.line
      ? trans.__('%1, cell [%2], line %3', where, c.execution_count, c.line)
      : trans.__('%1, cell [%2]', where, c.execution_count);
  }
  const asked = ev.requested_bytes ? formatBytes(ev.requested_bytes) : trans.__('an unknown amount');
  lines.push(trans.__('%1: asked for %2 (%3)', where, asked, ev.error));
  if (c.source) {
    lines.push(c.source);
  }
  const k = ev.kernel;
  const cached = k.cached_bytes;
  lines.push(
    cached
      ? trans.__(
          'this kernel: %1 allocated, %2 cached (%3 releasable, %4 fragmented)',
          formatBytes(k.allocated_bytes),
          formatBytes(cached),
          formatBytes(k.releasable_bytes),
          formatBytes(k.fragmented_bytes)
        )
      : trans.__('this kernel: %1 allocated, %2 cached', formatBytes(k.allocated_bytes), formatBytes(cached))
  );
  if (k.ipython_bytes) {
    lines.push(trans.__('held only by IPython: %1 (%2)', formatBytes(k.ipython_bytes), (k.ipython_refs || []).join(', ')));
  }
  if (ev.gpu) {
    const g = ev.gpu;
    lines.push(
      trans.__(
        'GPU %1 %2: %3 of %4 used, %5 free',
        g.index,
        g.simulated ? trans.__('%1 (simulated)', g.name) : g.name,
        formatBytes(g.used_bytes),
        formatBytes(g.total_bytes),
        formatBytes(g.free_bytes)
      )
    );
  }
  return lines;
}

/** The holders table's cells, a row per holder in the daemon's order: its name, user, memory and state. */
export function holderCells(ev: OOMEvent, trans: Trans = plainTrans): [string, string, string, string][] {
  return ev.holders.map(h => [
    h.name,
    h.user,
    formatBytes(h.bytes),
    h.state === 'idle' && h.idle_seconds ? trans.__('idle %1', formatDuration(h.idle_seconds)) : h.state || ''
  ]);
}

/** The report's DOM (text only: nothing the kernel sent becomes markup). */
export function reportNode(ev: OOMEvent, trans: Trans = plainTrans): HTMLElement {
  const box = el('div', 'jp-gpumem-report');
  box.dataset.gpumem = 'oom-report';
  box.appendChild(el('div', 'jp-gpumem-report-head', ev.headline));
  for (const line of reportLines(ev, trans)) {
    box.appendChild(el('div', '', line));
  }
  if (ev.holders.length) {
    // A row per holder that reflows at 250 px: its name in full, its memory, then its user and state.
    box.appendChild(
      listNode(
        'oom-holders',
        holderCells(ev, trans).map(([name, user, memory, state]) => ({
          name,
          bytes: memory,
          sub: [trans.__('user %1', user), state].filter(Boolean).join(' · ')
        }))
      )
    );
  }
  if (ev.advice) {
    const a = el('div', 'jp-gpumem-report-advice', trans.__('advice: %1', ev.advice));
    a.dataset.gpumem = 'oom-advice';
    box.appendChild(a);
  }
  return box;
}

// ---- memory snapshots: the daemon's reduction (sidecar/snapshot) ----

export interface SnapshotFrame {
  filename: string;
  line: number;
  name: string;
}

export interface SnapshotReduction {
  schema: number;
  devices: {
    device: number;
    segments: { count: number; reserved_bytes: number; allocated_bytes: number; inactive_bytes: number; truncated?: boolean };
    top_stacks: { stack: number; bytes: number; count: number }[];
    ooms: { time_us: number; requested_bytes: number; stack: number }[];
    timeline: { time_us: number[]; allocated: number[]; reserved: number[] };
    entries: number;
  }[];
  stacks: { id: number; frames: SnapshotFrame[]; frames_total: number; where?: SnapshotFrame }[];
}

/** A stack's one line: where it asked, else its innermost frame. */
export function stackLine(s: { frames: SnapshotFrame[]; where?: SnapshotFrame } | undefined): string {
  const f = s?.where ?? s?.frames[0];
  if (!f) {
    return '(no Python frame)';
  }
  return `${f.filename.slice(f.filename.lastIndexOf('/') + 1)}:${f.line} in ${f.name}`;
}

/** uPlot's data for one device's timeline: seconds since its start, then bytes allocated and reserved. */
export function timelineData(t: { time_us: number[]; allocated: number[]; reserved: number[] }): [number[], number[], number[]] {
  const t0 = t.time_us.length ? t.time_us[0] : 0;
  return [t.time_us.map(v => (v - t0) / 1e6), t.allocated, t.reserved];
}

/**
 * Draws a reduction into box: per device its segments' totals, the
 * timeline (uPlot) and the top stacks; rawUrl downloads the pickle that
 * pytorch.org/memory_viz opens. Resolves when drawn.
 */
export async function drawSnapshot(
  box: HTMLElement,
  red: SnapshotReduction,
  rawUrl: string,
  width: number,
  trans: Trans = plainTrans
): Promise<void> {
  const UPlot = (await import('uplot')).default;
  box.replaceChildren();
  box.dataset.gpumem = 'snapshot';
  const dl = el('a', 'jp-gpumem-download', trans.__('Download the .pickle (pytorch.org/memory_viz opens it)'));
  dl.href = rawUrl;
  dl.download = '';
  dl.dataset.gpumem = 'snapshot-download';
  box.appendChild(dl);
  const stacks = new Map(red.stacks.map(s => [s.id, s]));
  for (const d of red.devices) {
    const s = d.segments;
    box.appendChild(
      el(
        'div',
        'jp-gpumem-report-head',
        trans.__(
          'cuda:%1: %2 segments, %3 reserved, %4 allocated, %5 cached; %6 trace entries',
          d.device,
          s.count,
          formatBytes(s.reserved_bytes),
          formatBytes(s.allocated_bytes),
          formatBytes(s.inactive_bytes),
          d.entries
        )
      )
    );
    if (d.timeline.time_us.length) {
      const plot = el('div', 'jp-gpumem-snapshot-plot');
      plot.dataset.points = String(d.timeline.time_us.length);
      box.appendChild(plot);
      const font = currentTheme(box).font;
      const widthOf = canvasMeasure(font) ?? ((text: string) => 7 * text.length);
      const opts: uPlot.Options = {
        width,
        height: 160,
        legend: { show: true, live: false },
        cursor: { show: false },
        scales: { x: { time: false } },
        axes: [
          { label: trans.__('s') },
          { font, values: (_u, vals) => vals.map(v => formatBytes(v)), size: (_u, values) => axisSize(values ?? [], widthOf) }
        ],
        series: [
          {},
          { label: trans.__('allocated'), stroke: '#1f77b4', width: 1, points: { show: false } },
          { label: trans.__('reserved'), stroke: '#ff7f0e', width: 1, points: { show: false } }
        ]
      };
      new UPlot(opts, timelineData(d.timeline) as uPlot.AlignedData, plot);
    }
    // Where the memory was allocated, a row each: the line wraps at 250 px, the frames on hover.
    const list = listNode(
      'snapshot-stacks',
      d.top_stacks.slice(0, 10).map(ts => ({
        name: stackLine(stacks.get(ts.stack)),
        bytes: formatBytes(ts.bytes),
        sub: trans._n('%1 block', '%1 blocks', ts.count)
      }))
    );
    d.top_stacks.slice(0, 10).forEach((ts, i) => {
      const st = stacks.get(ts.stack);
      (list.children[i] as HTMLElement).title = (st?.frames ?? []).map(f => `${f.filename}:${f.line} ${f.name}`).join('\n');
    });
    box.append(el('h3', '', trans.__('Allocated at')), list);
    for (const o of d.ooms) {
      box.appendChild(
        el(
          'div',
          'jp-gpumem-report-advice',
          trans.__('out of memory asking %1 at %2', formatBytes(o.requested_bytes), stackLine(stacks.get(o.stack)))
        )
      );
    }
  }
}

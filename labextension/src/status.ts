// What the status bar item and its tooltip say, from the state the
// daemon sent: pure, unit-tested in status.test.ts. No figure is derived
// here: each is the daemon's, only laid out.

import { formatBytes, formatPercent, plainTrans, Trans } from './format';
import { Level, mainGPU, notebookOf, State } from './model';

/** What the status bar item shows. */
export interface StatusView {
  /** The label: this notebook's GPU memory, or "GPU n/a". */
  text: string;
  /** The notebook the figure is of (shown before it), or "". */
  name: string;
  /** The tooltip: the reason when there is no figure, else the figures. */
  lines: string[];
  /**
   * The bar, as fractions of the notebook's main GPU: this notebook's
   * bytes there and everyone else's; level (the daemon's) colours the
   * whole GPU's use.
   * Absent when there is no figure.
   */
  bar?: { mine: number; rest: number; level: Level; gpu: number };
}

/**
 * The status bar item for the notebook whose kernel is kernelId: its GPU
 * memory (the driver's figure, children included) and a bar of its main
 * GPU with both parts plainly (this notebook, everyone else), or "GPU n/a"
 * and why (gpumem serve not running, no driver or GPU, no kernel, a kernel
 * it does not follow). kernelId null: the current tab is not a notebook,
 * and the item names none (never the last notebook's figure, unnamed).
 */
export function statusView(
  state: State | null,
  unavailable: string | null,
  kernelId: string | undefined | null,
  trans: Trans = plainTrans
): StatusView {
  const na = trans.__('GPU n/a');
  if (!state) {
    return { text: na, name: '', lines: [unavailable ?? trans.__('Waiting for the first figures from gpumem serve…')] };
  }
  if (!state.gpus.length) {
    const why = state.warnings.length ? state.warnings.join('; ') : trans.__('gpumem serve sees no GPU on this machine.');
    return { text: na, name: '', lines: [trans.__('GPU n/a: %1', why)] };
  }
  if (kernelId === null) {
    return { text: trans.__('GPU'), name: '', lines: [trans.__('The current tab is not a notebook: open one to see its GPU memory.')] };
  }
  if (!kernelId) {
    return { text: na, name: '', lines: [trans.__('This tab has no running kernel: no GPU memory to show.')] };
  }
  const nb = notebookOf(state, kernelId);
  if (!nb) {
    return {
      text: na,
      name: '',
      lines: [trans.__('gpumem serve does not follow this kernel (yet): it shows the kernels it found in its runtime dirs.')]
    };
  }
  const sim = state.gpus.some(g => g.simulated) ? trans.__(' (simulated)') : '';
  const gpu = mainGPU(state, nb)!;
  const mine = nb.per_gpu.find(g => g.index === gpu.index)?.bytes ?? 0;
  const total = gpu.memory_total_bytes;
  const lines = [
    trans.__("%1: %2 on the GPU (the driver's figure, children included)", nb.display_name, formatBytes(nb.gpu_memory_bytes)),
    trans.__(
      'The bar is GPU %1: this notebook %2 (dark), everyone %3 of %4 (%5)',
      gpu.index,
      formatBytes(mine),
      formatBytes(gpu.memory_used_bytes),
      formatBytes(total),
      formatPercent(gpu.memory_used_bytes, total)
    )
  ];
  if (nb.peak_bytes) {
    lines.push(trans.__('Peak since the kernel started: %1', formatBytes(nb.peak_bytes)));
  }
  if (nb.per_gpu.length > 1) {
    for (const pg of nb.per_gpu) {
      lines.push(trans.__('On GPU %1: %2', pg.index, formatBytes(pg.bytes) + (pg.bytes_unknown ? trans.__(' and an unknown amount') : '')));
    }
  }
  if (nb.processes.length > 1) {
    lines.push(trans._n('%1 process: %2', '%1 processes: %2', nb.processes.length, nb.processes.map(p => `pid ${p.pid}`).join(', ')));
  }
  const bar =
    total > 0
      ? {
          mine: Math.min(1, mine / total),
          rest: Math.min(1, Math.max(0, gpu.memory_used_bytes - mine) / total),
          level: gpu.level,
          gpu: gpu.index
        }
      : undefined;
  return { text: `GPU ${formatBytes(nb.gpu_memory_bytes)}${sim}`, name: nb.display_name, lines, bar };
}

/**
 * Lines from the kernel's %gpumem summary data: per framework and device
 * what it uses and holds, or the kernel's own sentence when it holds
 * nothing (never a bare state word).
 */
export function frameworkLines(summary: unknown, trans: Trans = plainTrans): string[] {
  const fws = (summary as { frameworks?: unknown })?.frameworks;
  if (!Array.isArray(fws)) {
    return [];
  }
  const lines: string[] = [];
  for (const fw of fws as { label?: string; name?: string; message?: string; devices?: unknown[] }[]) {
    const label = fw.label || fw.name || '?';
    const devs = Array.isArray(fw.devices) ? fw.devices : [];
    if (!devs.length) {
      if (fw.message) {
        lines.push(`${label}: ${fw.message}`);
      }
      continue;
    }
    for (const d of devs as { device?: string; used?: number; held?: number | null }[]) {
      lines.push(
        typeof d.held === 'number'
          ? trans.__('%1 on %2: uses %3, holds %4', label, d.device ?? '?', formatBytes(d.used ?? 0), formatBytes(d.held))
          : trans.__('%1 on %2: uses %3', label, d.device ?? '?', formatBytes(d.used ?? 0))
      );
    }
  }
  return lines;
}

// Formatting of figures for the status bar, the panel and notifications.
// Pure: unit-tested in format.test.ts.

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

/** Bytes in binary units with one decimal ("3.2 GiB"), as gpumem prints them. */
export function formatBytes(bytes: number): string {
  if (!Number.isFinite(bytes) || bytes < 0) {
    return '?';
  }
  let v = bytes;
  let u = 0;
  while (v >= 1024 && u < UNITS.length - 1) {
    v /= 1024;
    u++;
  }
  if (u === 0) {
    return `${v} B`;
  }
  return `${v.toFixed(1)} ${UNITS[u]}`;
}

/** A share as a whole percentage ("42%"); "?" when the total is unknown. */
export function formatPercent(part: number, total: number): string {
  if (!(total > 0)) {
    return '?';
  }
  return `${Math.round((100 * part) / total)}%`;
}

export type Level = 'ok' | 'warn' | 'danger';

/** The danger line: above it the bar turns red, whatever the threshold. */
export const DANGER_RATIO = 0.95;

/**
 * The colour of a bar: red above 95% of the GPU, amber at or past the
 * daemon's alert threshold (a fraction; 0 or less means alerts are off),
 * else normal. It compares the GPU's used memory, as the daemon's alert does.
 */
export function levelFor(used: number, total: number, threshold: number): Level {
  if (!(total > 0)) {
    return 'ok';
  }
  const ratio = used / total;
  if (ratio > DANGER_RATIO) {
    return 'danger';
  }
  if (threshold > 0 && ratio >= threshold) {
    return 'warn';
  }
  return 'ok';
}

/** The file name of a notebook path ("train.ipynb" of "/a/b/train.ipynb"). */
export function baseName(path: string): string {
  const parts = path.split('/').filter(p => p !== '');
  return parts.length ? parts[parts.length - 1] : path;
}

/** "N orphans of train.ipynb holding 3.2 GiB after the restart". */
export function reclaimMessage(ev: {
  processes: number;
  bytes: number;
  notebook: string;
  kernel_id: string;
  reason: string;
}): string {
  const what = ev.processes === 1 ? '1 orphan' : `${ev.processes} orphans`;
  const of = ev.notebook ? baseName(ev.notebook) : `kernel ${ev.kernel_id.slice(0, 8)}`;
  const after = ev.reason === 'shutdown' ? 'the shutdown' : 'the restart';
  return `Ended ${what} of ${of} holding ${formatBytes(ev.bytes)} after ${after}`;
}

/** A utilization figure: "97% SM", or "unknown" (never 0 for unknown). */
export function formatUtil(u: { sm_percent: number } | undefined): string {
  return u ? `${Math.round(u.sm_percent)}% SM` : 'unknown';
}

/**
 * An SVG path for a sparkline of values (0 to max, at least 100) in a box
 * of width × height: one segment per run of known values, gaps left open.
 */
export function sparklinePath(values: (number | null)[], width: number, height: number): string {
  if (values.length === 0) {
    return '';
  }
  const top = Math.max(100, ...values.map(v => v ?? 0));
  const dx = values.length > 1 ? width / (values.length - 1) : 0;
  let d = '';
  let pen = false;
  values.forEach((v, i) => {
    if (v === null) {
      pen = false;
      return;
    }
    const x = (i * dx).toFixed(1);
    const y = (height - (height * v) / top).toFixed(1);
    d += `${pen ? 'L' : 'M'}${x},${y}`;
    pen = true;
  });
  return d;
}

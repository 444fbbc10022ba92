// Formatting of figures for the status bar, the panel and notifications.
// Bytes and durations read as every face of gpumem writes them: the twins
// of Go's units.Bytes and units.Duration, tested against the same table
// (testdata/formats.json at the repository's root). Pure: unit-tested in
// format.test.ts.

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

/** bytes in the largest binary unit that keeps the number at or above 1: [number, unit index]. */
function inUnit(bytes: number): [number, number] {
  let v = bytes;
  let u = 0;
  while (v >= 1024 && u < UNITS.length - 1) {
    v /= 1024;
    u++;
  }
  return [v, u];
}

/**
 * Bytes in binary units with one decimal ("3.2 GiB"), as gpumem prints
 * them: a tie goes to the even tenth, as Go's strconv and Python's "%.1f"
 * round (toFixed would write 1.25 KiB as "1.3 KiB", they "1.2 KiB").
 */
export function formatBytes(bytes: number): string {
  if (!Number.isFinite(bytes) || bytes < 0) {
    return '?';
  }
  const whole = Math.round(bytes);
  const [, u] = inUnit(whole);
  if (u === 0) {
    return `${whole} B`;
  }
  // In tenths of the unit, exactly: the unit is a power of two.
  const div = 1024n ** BigInt(u);
  const scaled = BigInt(whole) * 10n;
  let tenths = scaled / div;
  const twice = 2n * (scaled % div);
  if (twice > div || (twice === div && tenths % 2n === 1n)) {
    tenths += 1n;
  }
  return `${tenths / 10n}.${tenths % 10n} ${UNITS[u]}`;
}

/** "<a> <unitA>", with " <b> <unitB>" unless b is 0. */
function twoUnits(a: number, unitA: string, b: number, unitB: string): string {
  return b ? `${a} ${unitA} ${b} ${unitB}` : `${a} ${unitA}`;
}

/**
 * A duration for people, in at most two units, the second left out when
 * 0, rounded to the smaller unit shown: "250 ms", "45 s", "1 min 30 s",
 * "3 h 5 min", "27 h 13 min", "2 d 3 h" (hours up to 48); "0 s" for none
 * (or less). Go's units.Duration.
 */
export function formatDuration(seconds: number): string {
  if (!Number.isFinite(seconds)) {
    return '?';
  }
  const ms = Math.round(seconds * 1000);
  if (ms <= 0) {
    return '0 s';
  }
  if (ms < 1000) {
    return `${ms} ms`;
  }
  const s = Math.round(seconds);
  if (s < 60) {
    return `${s} s`;
  }
  if (s < 3600) {
    return twoUnits(Math.floor(s / 60), 'min', s % 60, 's');
  }
  const m = Math.round(seconds / 60);
  if (m < 48 * 60) {
    return twoUnits(Math.floor(m / 60), 'h', m % 60, 'min');
  }
  const h = Math.round(seconds / 3600);
  return twoUnits(Math.floor(h / 24), 'd', h % 24, 'h');
}

/** A share as a whole percentage ("42%"); "?" when the total is unknown. */
export function formatPercent(part: number, total: number): string {
  if (!(total > 0)) {
    return '?';
  }
  return `${Math.round((100 * part) / total)}%`;
}

/**
 * What formats text for people: JupyterLab's TranslationBundle has this
 * shape (ITranslator's load()); plainTrans is the untranslated one, for
 * the pure functions' defaults and their tests. Placeholders are %1, %2…
 */
export interface Trans {
  __(msgid: string, ...args: (string | number)[]): string;
  _n(singular: string, plural: string, n: number, ...args: (string | number)[]): string;
}

function fill(msg: string, args: (string | number)[]): string {
  return msg.replace(/%(\d+)/g, (m, i) => (Number(i) >= 1 && Number(i) <= args.length ? String(args[Number(i) - 1]) : m));
}

export const plainTrans: Trans = {
  __: (msgid, ...args) => fill(msgid, args),
  _n: (singular, plural, n, ...args) => fill(n === 1 ? singular : plural, [n, ...args])
};

const BINARY_STEPS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];

/**
 * Axis ticks for bytes at round binary steps (0, 16, 32, 48 GiB…): the
 * smallest step of 2^k of a binary unit that reaches max in at most
 * maxTicks steps. The last tick is at or above max: the axis's top.
 */
export function binaryTicks(max: number, maxTicks = 4): number[] {
  const top = Number.isFinite(max) && max > 0 ? max : 0;
  let step = 1024 ** 3; // an empty plot still reads in GiB
  if (top > 0) {
    search: for (let u = 0; u < UNITS.length; u++) {
      for (const m of BINARY_STEPS) {
        const s = m * 1024 ** u;
        if (Math.ceil(top / s) <= Math.max(1, maxTicks)) {
          step = s;
          break search;
        }
      }
    }
  }
  const n = Math.max(1, Math.ceil(top / step));
  return Array.from({ length: n + 1 }, (_, i) => i * step);
}

/** A tick's label: whole binary units where it can ("16 GiB", "1.5 GiB", "0"). */
export function formatTick(bytes: number): string {
  if (!(bytes > 0)) {
    return '0';
  }
  const [v, u] = inUnit(bytes);
  const text = Number.isInteger(v) ? String(v) : v.toFixed(1).replace(/\.0$/, '');
  return `${text} ${UNITS[u]}`;
}

/**
 * A time axis label: the time of day only, never a date on a short axis
 * ("14:05", "14:05:30" within a few minutes); on an axis of many hours, a
 * tick at midnight names the day instead ("Dec 2").
 */
export function timeTick(unixSeconds: number, spanSeconds: number, locale?: string): string {
  const d = new Date(unixSeconds * 1000);
  if (spanSeconds > 12 * 3600 && d.getHours() === 0 && d.getMinutes() === 0) {
    return d.toLocaleDateString(locale, { month: 'short', day: 'numeric' });
  }
  const opts: Intl.DateTimeFormatOptions = { hour: '2-digit', minute: '2-digit', hour12: false };
  if (spanSeconds <= 180) {
    opts.second = '2-digit';
  }
  return d.toLocaleTimeString(locale, opts);
}

/**
 * A notebook's SM utilization as the daemon charges it ("97% SM", over
 * 100 for several GPUs), or "SM unknown" where the GPU cannot say: never
 * 0 for unknown.
 */
export function formatUtil(u: { sm_percent: number } | undefined, trans: Trans = plainTrans): string {
  return u ? trans.__('%1% SM', Math.round(u.sm_percent)) : trans.__('SM unknown');
}

/** A time of day to the second, 24-hour ("14:05:12"): what "as of" says. */
export function clockTime(unixSeconds: number, locale?: string): string {
  return new Date(unixSeconds * 1000).toLocaleTimeString(locale, {
    hour: '2-digit',
    minute: '2-digit',
    second: '2-digit',
    hour12: false
  });
}

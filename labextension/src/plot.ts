// One GPU's plot (uPlot): this server's notebooks stacked, each band that
// notebook's bytes on this GPU, and the GPU's used memory as a line above
// them, each band opaque in its row's colour. Where notebooks share a
// GPU, the panel draws their legend under the plot (panel_plots.ts), and
// resting the pointer on a band names it. Ticks at round binary steps,
// times of day only.

import type uPlot from 'uplot';

import { binaryTicks, formatBytes, formatTick, timeTick, Trans } from './format';
import { Stacked } from './model';

/** The colours a plot takes from the theme (read when it is drawn). */
export interface PlotTheme {
  text: string;
  grid: string;
  used: string;
  /** The axes' font (a canvas font: its size in CSS px). */
  font: string;
}

export function currentTheme(node: HTMLElement): PlotTheme {
  const css = getComputedStyle(node);
  const v = (name: string, fallback: string) => css.getPropertyValue(name).trim() || fallback;
  return {
    text: v('--jp-ui-font-color2', '#616161'),
    grid: v('--jp-border-color2', '#e0e0e0'),
    used: v('--jp-ui-font-color1', '#212121'),
    font: `11px ${v('--jp-ui-font-family', 'system-ui, sans-serif')}`
  };
}

/** The y axis's tick length and the gap between a tick and its label (px). */
export const Y_TICK = 6;
export const Y_GAP = 4;

/**
 * The width of a y axis whose labels are labels: the widest as measure
 * says (in CSS px, the axis's font), its tick, the gap and a pixel each
 * side, so that "128 GiB" keeps its first digit.
 */
export function axisSize(labels: readonly string[], measure: (text: string) => number): number {
  const widest = Math.max(0, ...labels.map(measure));
  return Math.ceil(widest) + Y_TICK + Y_GAP + 2;
}

let measureCtx: CanvasRenderingContext2D | null | undefined;

/** Measures text in font with a canvas of its own (null where there is no canvas). */
export function canvasMeasure(font: string): ((text: string) => number) | null {
  measureCtx ??= document.createElement('canvas').getContext('2d');
  const ctx = measureCtx;
  if (!ctx) {
    return null;
  }
  return text => {
    ctx.font = font;
    return ctx.measureText(text).width;
  };
}

export const PLOT_HEIGHT = 120;

/** What a plot shows at a time: the band (or the rest of the GPU) under the pointer. */
export function identityAt(st: Stacked, idx: number, bytes: number, trans: Trans): string | null {
  if (idx < 0 || idx >= st.times.length) {
    return null;
  }
  let below = 0;
  for (const s of st.stacks) {
    const upper = s.values[idx] ?? below;
    if (bytes <= upper && upper > below) {
      return trans.__('%1: %2', s.label, formatBytes(upper - below));
    }
    below = upper;
  }
  const used = st.used[idx];
  if (used !== null && used !== undefined && bytes <= used && used > below) {
    return trans.__('Other users and processes: %1', formatBytes(used - below));
  }
  return null;
}

/**
 * uPlot's options for a GPU's plot of st, width pixels wide; current is
 * the data drawn now (setData replaces it), for naming the band under the
 * pointer. stepped
 * draws each point's figure until the next (minute points: each holds a
 * minute's highest figure); without it, points are joined.
 */
export function plotOptions(
  st: Stacked,
  current: () => Stacked,
  width: number,
  colors: string[],
  theme: PlotTheme,
  trans: Trans,
  onHover: (text: string | null, left: number) => void,
  stepped?: uPlot.Series.PathBuilder,
  measure: ((text: string) => number) | null = canvasMeasure(theme.font)
): uPlot.Options {
  const axis = { stroke: theme.text, font: theme.font, grid: { stroke: theme.grid, width: 1 }, ticks: { stroke: theme.grid, width: 1 } };
  // Without a canvas to measure with: 7 px a character, a wide guess.
  const widthOf = measure ?? ((text: string) => 7 * text.length);
  const bands = [...st.stacks].reverse(); // the top of the stack first: lower bands cover it
  return {
    width,
    height: PLOT_HEIGHT,
    legend: { show: false },
    padding: [8, 26, 0, 0], // room for the last time label ("14:05:30" is centred on its tick)
    cursor: { x: true, y: false, points: { show: false }, drag: { x: false, y: false } },
    scales: {
      x: { time: true },
      // 0 to the next round binary step above the highest figure drawn.
      y: { range: (_u, _min, max) => [0, topTick(max)] }
    },
    axes: [
      {
        ...axis,
        space: 64,
        size: 28,
        // The span drawn now (it grows with the history): seconds only on a few minutes.
        values: (u, vals) => vals.map(v => timeTick(v, (u.scales.x.max ?? 0) - (u.scales.x.min ?? 0)))
      },
      {
        ...axis,
        ticks: { ...axis.ticks, size: Y_TICK },
        gap: Y_GAP,
        // As wide as its widest label, measured: a fixed width cut "128 GiB" to "28 GiB".
        size: (_u, values) => axisSize(values ?? [], widthOf),
        splits: (_u, _i, _min, max) => binaryTicks(max, 3),
        values: (_u, vals) => vals.map(v => formatTick(v))
      }
    ],
    series: [
      {},
      ...bands.map((s, i) => ({
        label: s.label,
        stroke: colors[bands.length - 1 - i],
        // Opaque: a band drawn over the one above it (each fills from 0 to its
        // stack's top) would blend with it, and read as neither row's swatch.
        fill: colors[bands.length - 1 - i],
        width: 1,
        paths: stepped,
        points: { show: false }
      })),
      { label: trans.__('GPU used (everyone)'), stroke: theme.used, width: 1, dash: [4, 3], paths: stepped, points: { show: false } }
    ],
    hooks: {
      setCursor: [
        u => {
          const { idx, top, left } = u.cursor;
          if (idx === null || idx === undefined || top === undefined || top < 0) {
            onHover(null, 0);
            return;
          }
          onHover(identityAt(current(), idx, u.posToVal(top, 'y'), trans), left ?? 0);
        }
      ]
    }
  };
}

function topTick(max: number): number {
  const ticks = binaryTicks(max, 3);
  return ticks[ticks.length - 1];
}

/** uPlot's data for st: times, the bands (top first), the used line. */
export function plotData(st: Stacked): uPlot.AlignedData {
  return [st.times, ...[...st.stacks].reverse().map(s => s.values), st.used] as uPlot.AlignedData;
}

// The panel's GPUs: per GPU a head (its name, figure and a bar at the
// daemon's level) and a plot of this server's notebooks on it (plot.ts),
// uPlot loaded when the panel first draws; and the colours the plots and
// the notebook rows share.

import type uPlot from 'uplot';

import { el } from './dom';
import { binaryTicks, formatBytes, formatPercent, formatTick, Trans } from './format';
import { GPU, Stacked, stackNotebooks, State } from './model';
import { currentTheme, plotData, plotOptions, PlotTheme, PLOT_HEIGHT, Y_GAP, Y_TICK } from './plot';
import { StateSource } from './source';

// uPlot is loaded when the panel first draws, not with JupyterLab's page.
let uPlotClass: typeof uPlot | null = null;
let uPlotLoading: Promise<void> | null = null;
function loadUPlot(): Promise<void> {
  uPlotLoading ??= import('uplot').then(m => {
    uPlotClass = m.default;
  });
  return uPlotLoading;
}

const PALETTE = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f', '#bcbd22', '#17becf'];

/** A colour per kernel, the same in its plot band and its row, in the order kernels are first drawn. */
export class Palette {
  private _colors = new Map<string, string>();

  color(kernelId: string): string {
    let c = this._colors.get(kernelId);
    if (!c) {
      c = PALETTE[this._colors.size % PALETTE.length];
      this._colors.set(kernelId, c);
    }
    return c;
  }
}

interface GPUPlot {
  box: HTMLElement;
  head: HTMLDivElement;
  plotBox: HTMLDivElement;
  hover: HTMLDivElement;
  legend: HTMLUListElement;
  empty: HTMLDivElement;
  plot: uPlot | null;
  key: string; // what the plot was made for: bands, width, theme, window, step
  data: Stacked; // what it draws now
}

/** The GPUs' heads and plots, in node. */
export class GpuPlots {
  readonly node = el('div', 'jp-gpumem-gpus');
  private _plots = new Map<number, GPUPlot>();

  constructor(
    private _source: StateSource,
    private _palette: Palette,
    private _trans: Trans,
    /** Asks the panel to draw again (once uPlot has loaded). */
    private _requestUpdate: () => void
  ) {}

  /** Draws every GPU's head and plot; a GPU gone from the state loses its box. */
  render(state: State, windowSeconds: number, themeNode: HTMLElement): void {
    if (!state.gpus.length) {
      for (const p of this._plots.values()) {
        p.plot?.destroy();
      }
      this._plots.clear();
      // The status line above says why (the daemon's warnings), once; without one, this says it.
      this.node.replaceChildren(
        ...(state.warnings.length ? [] : [el('div', 'jp-gpumem-empty', this._trans.__('GPU n/a: gpumem serve sees no GPU.'))])
      );
      return;
    }
    const UPlot = uPlotClass;
    if (!UPlot) {
      void loadUPlot().then(() => this._requestUpdate());
      return;
    }
    const hist = this._source.historyFor(windowSeconds);
    const theme = currentTheme(themeNode);
    const seen = new Set<number>();
    for (const g of state.gpus) {
      seen.add(g.index);
      const p = this._plotBox(g.index);
      this._renderHead(p.head, g);
      const st = stackNotebooks(hist, state.notebooks, g.index, windowSeconds);
      p.data = st;
      // The newest top of this server's stack: what the plot shows last, for tests.
      const last = st.stacks.length ? st.stacks[st.stacks.length - 1].values : [];
      p.box.dataset.stackTop = String(last.length ? (last[last.length - 1] ?? 0) : 0);
      p.box.dataset.bands = st.stacks.map(s => s.kernelId).join(',');
      const ticks = binaryTicks(st.top, 3);
      p.box.dataset.yTicks = ticks.join(','); // what the axis shows
      p.box.dataset.yLabels = ticks.map(formatTick).join('|');
      p.box.dataset.axisFont = theme.font;
      p.box.dataset.axisPad = String(Y_TICK + Y_GAP);
      p.empty.hidden = st.stacks.length > 0;
      this._renderLegend(p.legend, st);
      p.empty.textContent = this._trans.__('No notebook of this server holds memory on GPU %1.', g.index);
      const width = Math.max(120, p.box.clientWidth);
      const key = `${st.stacks.map(s => s.kernelId).join(',')}|${width}|${themeKey(theme)}|${windowSeconds}|${hist.step}`;
      if (!p.plot || p.key !== key) {
        p.plot?.destroy();
        const colors = st.stacks.map(s => this._palette.color(s.kernelId));
        const box = p;
        const opts = plotOptions(
          st,
          () => box.data,
          width,
          colors,
          theme,
          this._trans,
          (text, left) => {
            box.hover.hidden = !text;
            box.hover.textContent = text ?? '';
            box.hover.style.left = `${Math.min(Math.max(0, left), width - 120)}px`;
          },
          hist.step > 1 ? UPlot.paths.stepped?.({ align: 1 }) : undefined
        );
        p.plot = new UPlot(opts, plotData(st), p.plotBox);
        p.key = key;
      } else {
        p.plot.setData(plotData(st));
      }
    }
    for (const [idx, p] of this._plots) {
      if (!seen.has(idx)) {
        p.plot?.destroy();
        p.box.remove();
        this._plots.delete(idx);
      }
    }
  }

  private _plotBox(index: number): GPUPlot {
    let p = this._plots.get(index);
    if (!p) {
      const box = el('section', 'jp-gpumem-gpu');
      box.dataset.gpu = String(index);
      const head = el('div', 'jp-gpumem-gpu-head');
      const plotBox = el('div', 'jp-gpumem-plot');
      plotBox.style.minHeight = `${PLOT_HEIGHT}px`;
      const hover = el('div', 'jp-gpumem-plot-hover');
      hover.hidden = true;
      hover.setAttribute('role', 'tooltip');
      const empty = el('div', 'jp-gpumem-empty');
      const legend = el('ul', 'jp-gpumem-legend');
      legend.dataset.gpumem = 'plot-legend';
      plotBox.appendChild(hover);
      box.append(head, plotBox, legend, empty);
      for (const c of Array.from(this.node.children)) {
        if (!c.classList.contains('jp-gpumem-gpu')) {
          c.remove(); // the "no GPU" line
        }
      }
      this.node.appendChild(box);
      p = { box, head, plotBox, hover, legend, empty, plot: null, key: '', data: { times: [], stacks: [], used: [], top: 0 } };
      this._plots.set(index, p);
    }
    return p;
  }

  /** The plot's legend where notebooks share the GPU: each band's colour and name, top of the stack first. */
  private _renderLegend(legend: HTMLUListElement, st: Stacked): void {
    legend.hidden = st.stacks.length < 2;
    const key = st.stacks.map(s => `${s.kernelId}=${s.label}`).join('|');
    if (legend.hidden || legend.dataset.key === key) {
      return;
    }
    legend.dataset.key = key;
    legend.replaceChildren(
      ...[...st.stacks].reverse().map(s => {
        const li = el('li', '');
        const sw = el('span', 'jp-gpumem-swatch');
        sw.style.background = this._palette.color(s.kernelId);
        sw.setAttribute('aria-hidden', 'true');
        li.dataset.kernelId = s.kernelId;
        li.append(sw, el('span', 'jp-gpumem-legend-name', s.label));
        return li;
      }),
      this._usedKey()
    );
  }

  /** The legend's entry for the dashed line: the GPU's used memory, everyone's. */
  private _usedKey(): HTMLLIElement {
    const li = el('li', 'jp-gpumem-legend-used');
    li.append(el('span', 'jp-gpumem-legend-dash'), el('span', 'jp-gpumem-legend-name', this._trans.__('GPU used (everyone)')));
    return li;
  }

  private _renderHead(head: HTMLDivElement, g: GPU): void {
    const trans = this._trans;
    const name = `GPU ${g.index} · ${g.name}${g.simulated ? trans.__(' (simulated)') : ''}`;
    const title = el('div', 'jp-gpumem-gpu-title', name);
    title.title = name;
    const used = trans.__(
      '%1 / %2 used · %3',
      formatBytes(g.memory_used_bytes),
      formatBytes(g.memory_total_bytes),
      formatPercent(g.memory_used_bytes, g.memory_total_bytes)
    );
    const fig = el('div', 'jp-gpumem-gpu-figure', used);
    fig.dataset.gpumem = 'gpu-figure';
    const bar = el('span', 'jp-gpumem-bar jp-gpumem-bar-wide');
    bar.setAttribute('role', 'meter');
    bar.setAttribute('aria-label', trans.__('GPU %1 memory used', g.index));
    bar.setAttribute('aria-valuemin', '0');
    bar.setAttribute('aria-valuemax', String(g.memory_total_bytes));
    bar.setAttribute('aria-valuenow', String(g.memory_used_bytes));
    bar.setAttribute('aria-valuetext', used);
    const fill = el('span', 'jp-gpumem-bar-fill');
    fill.style.width = `${Math.min(100, (100 * g.memory_used_bytes) / Math.max(g.memory_total_bytes, 1)).toFixed(1)}%`;
    bar.dataset.level = g.level;
    bar.appendChild(fill);
    head.replaceChildren(title, fig, bar);
  }
}

function themeKey(t: PlotTheme): string {
  return `${t.text}/${t.grid}/${t.used}/${t.font}`;
}

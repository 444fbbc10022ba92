// The "GPU memory" side panel, laid out for a sidebar of 250 to 600 px: a
// heading with the plot window's selector; per GPU its use and a plot of
// this server's notebooks on it (plot.ts); one compact row per notebook
// (its name cut with an ellipsis, the full path on hover, its figure, a
// sparkline, and an actions menu); other users as totals; the variables
// of a notebook, its "why" or an out-of-memory report and memory snapshot
// when asked. It draws what the state source holds: no request of its own
// but its actions'.

import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { JupyterFrontEnd } from '@jupyterlab/application';
import { Menu, Widget } from '@lumino/widgets';
import type uPlot from 'uplot';

import { fetchSnapshot, fetchSnapshots, fetchVars, fetchWhy, freeCache, freeChildren, snapshotRawUrl } from './api';
import { el, headedTable } from './dom';
import { binaryTicks, formatBytes, formatPercent, formatUtil, plainTrans, Trans } from './format';
import { GPU, kernelLabel, Notebook, plotRange, sparkPath, Stacked, stackNotebooks, State, varRows, WINDOWS } from './model';
import { drawSnapshot, OOMEvent, reportNode, SnapshotReduction } from './oom';
import { currentTheme, plotData, plotOptions, PlotTheme, PLOT_HEIGHT } from './plot';
import { StateSource } from './source';
import { busyLines, choiceOf, FreeWorkersChoice, pidsToConfirm, planFreeWorkers } from './workers';

/** What the panel needs from the application. */
export interface PanelActions {
  commands: JupyterFrontEnd['commands'];
  /** The plot window chosen in the panel, in seconds (saved as a setting). */
  setWindow(seconds: number): void;
}

/** The commands of a notebook's actions menu (registered by the plugin). */
export const NOTEBOOK_COMMANDS = [
  'gpumem:free-cache',
  'gpumem:show-variables',
  'gpumem:why',
  'gpumem:free-workers',
  'gpumem:restart-kernel',
  'gpumem:open-notebook'
];

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
const SVG = 'http://www.w3.org/2000/svg';

interface GPUPlot {
  box: HTMLElement;
  head: HTMLDivElement;
  plotBox: HTMLDivElement;
  hover: HTMLDivElement;
  empty: HTMLDivElement;
  plot: uPlot | null;
  key: string; // what the plot was made for: bands, width, theme, window, step
  data: Stacked; // what it draws now
}

export class GpuPanel extends Widget {
  private _heading = el('h2', 'jp-gpumem-heading');
  private _window = el('select', 'jp-gpumem-window');
  private _status = el('div', 'jp-gpumem-panel-status');
  private _daemon = el('div', 'jp-gpumem-daemon');
  private _gpus = el('div', 'jp-gpumem-gpus');
  private _notebooks = el('section', 'jp-gpumem-notebooks');
  private _others = el('section', 'jp-gpumem-others');
  private _vars = el('section', 'jp-gpumem-vars');
  // An out-of-memory report or a memory snapshot, opened from a notification.
  private _report = el('section', 'jp-gpumem-report-area');
  private _plots = new Map<number, GPUPlot>();
  private _colors = new Map<string, string>();
  private _windowSeconds = 15 * 60;

  constructor(
    private _source: StateSource,
    private _actions: PanelActions,
    private _trans: Trans = plainTrans
  ) {
    super();
    const trans = _trans;
    this.id = 'jp-gpumem-panel';
    this.addClass('jp-gpumem-panel');
    this.title.caption = trans.__('GPU memory');
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-label', trans.__('GPU memory'));
    this._heading.textContent = trans.__('GPU memory');
    const head = el('div', 'jp-gpumem-header');
    const label = el('label', 'jp-gpumem-window-label');
    label.append(el('span', 'jp-gpumem-sr', trans.__('Plot window')), this._window);
    this._window.dataset.gpumem = 'window';
    this._window.title = trans.__('How far back the plots go');
    const names = [trans.__('5 min'), trans.__('15 min'), trans.__('1 h'), trans.__('24 h')];
    WINDOWS.forEach((w, i) => {
      const o = el('option', '', names[i]);
      o.value = String(w);
      this._window.appendChild(o);
    });
    this._window.value = String(this._windowSeconds);
    this._window.onchange = () => {
      this.windowSeconds = Number(this._window.value);
      this._actions.setWindow(this._windowSeconds);
    };
    head.append(this._heading, label);
    this._status.dataset.gpumem = 'panel-status';
    this._status.setAttribute('role', 'status');
    this._daemon.dataset.gpumem = 'daemon-status';
    this._vars.dataset.gpumem = 'vars';
    this._report.hidden = true;
    this.node.append(head, this._daemon, this._status, this._report, this._gpus, this._notebooks, this._others, this._vars);
    _source.changed.connect(() => {
      if (this.isVisible) {
        this.update();
      }
    });
  }

  /** The plots' window, in seconds (one of WINDOWS). */
  get windowSeconds(): number {
    return this._windowSeconds;
  }
  set windowSeconds(seconds: number) {
    const w = WINDOWS.includes(seconds) ? seconds : 15 * 60;
    if (w === this._windowSeconds) {
      return;
    }
    this._windowSeconds = w;
    this._window.value = String(w);
    this._source.window = w;
    this.update();
  }

  protected onAfterShow(): void {
    this.update();
  }

  protected onResize(): void {
    this.update();
  }

  private _color(kernelId: string): string {
    let c = this._colors.get(kernelId);
    if (!c) {
      c = PALETTE[this._colors.size % PALETTE.length];
      this._colors.set(kernelId, c);
    }
    return c;
  }

  protected onUpdateRequest(): void {
    const daemon = this._source.daemon;
    this._daemon.textContent = daemon?.text ?? '';
    this._daemon.dataset.case = daemon?.case ?? '';
    this._daemon.hidden = !daemon;
    const state = this._source.state;
    const trans = this._trans;
    if (!state) {
      this._status.textContent = this._source.unavailable ?? trans.__('Waiting for the first figures from gpumem serve…');
      this._status.hidden = false;
      this._gpus.hidden = this._notebooks.hidden = this._others.hidden = this._vars.hidden = true;
      return;
    }
    this._status.hidden = state.warnings.length === 0;
    this._status.textContent = state.warnings.join('; ');
    this._gpus.hidden = this._notebooks.hidden = this._others.hidden = this._vars.hidden = false;
    this._renderGPUs(state);
    this._renderNotebooks(state);
    this._renderOthers(state);
  }

  private _renderGPUs(state: State): void {
    if (!state.gpus.length) {
      for (const p of this._plots.values()) {
        p.plot?.destroy();
      }
      this._plots.clear();
      this._gpus.replaceChildren(el('div', 'jp-gpumem-empty', this._trans.__('No GPU figures (the line above says why).')));
      return;
    }
    const UPlot = uPlotClass;
    if (!UPlot) {
      void loadUPlot().then(() => this.update());
      return;
    }
    const hist = this._source.historyFor(this._windowSeconds);
    const theme = currentTheme(this.node);
    const seen = new Set<number>();
    for (const g of state.gpus) {
      seen.add(g.index);
      const p = this._plotBox(g.index);
      this._renderGPUHead(p.head, g);
      const st = stackNotebooks(hist, state.notebooks, g.index, this._windowSeconds);
      p.data = st;
      // The newest top of this server's stack: what the plot shows last, for tests.
      const last = st.stacks.length ? st.stacks[st.stacks.length - 1].values : [];
      p.box.dataset.stackTop = String(last.length ? (last[last.length - 1] ?? 0) : 0);
      p.box.dataset.bands = st.stacks.map(s => s.kernelId).join(',');
      p.box.dataset.yTicks = binaryTicks(st.top, 3).join(','); // what the axis shows
      p.empty.hidden = st.stacks.length > 0;
      p.empty.textContent = this._trans.__('No notebook of this server holds memory on GPU %1.', g.index);
      const width = Math.max(120, p.box.clientWidth);
      const key = `${st.stacks.map(s => s.kernelId).join(',')}|${width}|${themeKey(theme)}|${this._windowSeconds}|${hist.step}`;
      if (!p.plot || p.key !== key) {
        p.plot?.destroy();
        const colors = st.stacks.map(s => this._color(s.kernelId));
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
      plotBox.appendChild(hover);
      box.append(head, plotBox, empty);
      for (const c of Array.from(this._gpus.children)) {
        if (!c.classList.contains('jp-gpumem-gpu')) {
          c.remove(); // the "no GPU" line
        }
      }
      this._gpus.appendChild(box);
      p = { box, head, plotBox, hover, empty, plot: null, key: '', data: { times: [], stacks: [], used: [], top: 0 } };
      this._plots.set(index, p);
    }
    return p;
  }

  private _renderGPUHead(head: HTMLDivElement, g: GPU): void {
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

  private _renderNotebooks(state: State): void {
    const trans = this._trans;
    const box = this._notebooks;
    box.replaceChildren(el('h3', '', trans.__('Notebooks of this server')));
    if (!state.notebooks.length) {
      box.appendChild(
        el(
          'div',
          'jp-gpumem-empty',
          trans.__('No kernel of this server is followed by gpumem serve yet: open a notebook and start its kernel.')
        )
      );
      return;
    }
    const list = el('ul', 'jp-gpumem-rows');
    const rows = [...state.notebooks].sort((a, b) => b.gpu_memory_bytes - a.gpu_memory_bytes || a.kernel_id.localeCompare(b.kernel_id));
    const hist = this._source.historyFor(this._windowSeconds);
    const [from, to] = plotRange(hist.first(), hist.last || hist.now, this._windowSeconds);
    const max = Math.max(1, ...rows.map(nb => Math.max(nb.peak_bytes ?? 0, nb.gpu_memory_bytes)));
    for (const nb of rows) {
      const row = this._notebookRow(nb, this._source.reclaimed.get(nb.kernel_id) ?? 0, hist.notebooks.get(nb.kernel_id), from, to, max);
      this._workLine(row, nb, hist.sm.get(nb.kernel_id), from, to, hist.step);
      if (!state.gpus.length) {
        // No GPU figures at all (no driver): no notebook holds "0 B".
        const fig = row.querySelector<HTMLElement>('[data-field=now]')!;
        fig.textContent = trans.__('n/a');
        fig.title = trans.__('No GPU figures: %1', state.warnings.join('; ') || trans.__('gpumem serve sees no GPU.'));
        for (const extra of Array.from(row.querySelectorAll('.jp-gpumem-details, .jp-gpumem-spark, .jp-gpumem-work'))) {
          extra.remove();
        }
      }
      list.appendChild(row);
    }
    box.appendChild(list);
  }

  private _notebookRow(
    nb: Notebook,
    orphans: number,
    points: Map<number, number> | undefined,
    from: number,
    to: number,
    max: number
  ): HTMLLIElement {
    const trans = this._trans;
    const label = nb.display_name;
    const row = el('li', 'jp-gpumem-row');
    row.dataset.kernelId = nb.kernel_id;
    row.dataset.gpumem = 'notebook-row';
    const swatch = el('span', 'jp-gpumem-swatch');
    swatch.style.background = this._color(nb.kernel_id);
    swatch.setAttribute('aria-hidden', 'true');
    const name = el('span', 'jp-gpumem-name', label);
    name.title = nb.path || nb.notebook || label;
    const now = el('span', 'jp-gpumem-figure', formatBytes(nb.gpu_memory_bytes));
    now.dataset.field = 'now';
    now.title = trans.__("GPU memory of the kernel and its children now (the driver's figure)");
    const more = el('button', 'jp-gpumem-more jp-Button jp-mod-minimal');
    more.dataset.gpumem = 'notebook-actions';
    more.setAttribute('aria-label', trans.__('Actions for %1', label));
    more.setAttribute('aria-haspopup', 'menu');
    more.title = trans.__('Free cache, variables, why, free workers, restart, open');
    more.textContent = '⋯';
    more.onclick = () => {
      const r = more.getBoundingClientRect();
      this._menu(nb.kernel_id).open(r.left, r.bottom);
    };
    const spark = document.createElementNS(SVG, 'svg');
    spark.classList.add('jp-gpumem-spark');
    spark.setAttribute('viewBox', '0 0 100 14');
    spark.setAttribute('preserveAspectRatio', 'none');
    spark.setAttribute('aria-hidden', 'true');
    const sparkTitle = document.createElementNS(SVG, 'title');
    sparkTitle.textContent = trans.__("%1's GPU memory over the plot's window", label);
    spark.appendChild(sparkTitle);
    const path = document.createElementNS(SVG, 'path');
    path.setAttribute('d', sparkPath(points, from, to, 100, 14, max));
    path.setAttribute('stroke', this._color(nb.kernel_id));
    spark.appendChild(path);
    const details = el('span', 'jp-gpumem-details');
    const field = (key: string, text: string, title: string) => {
      const s = el('span', '', text);
      s.dataset.field = key;
      s.title = title;
      return s;
    };
    const procs = Math.max(nb.processes.length, nb.pids.length ? 1 : 0);
    details.append(
      field(
        'peak',
        // The daemon leaves a peak of 0 out.
        trans.__('peak %1', formatBytes(nb.peak_bytes ?? 0)),
        trans.__('The highest figure since the kernel started')
      ),
      field(
        'procs',
        trans._n('%1 process', '%1 processes', procs),
        trans.__('Processes of the kernel holding GPU memory, the kernel included')
      ),
      field(
        'orphans',
        trans._n('%1 orphan ended', '%1 orphans ended', orphans),
        trans.__('Processes of an earlier kernel process that gpumem serve ended')
      )
    );
    details.querySelector('[data-field=procs]')!.setAttribute('data-count', String(procs));
    const ended = details.querySelector<HTMLElement>('[data-field=orphans]')!;
    ended.dataset.count = String(orphans);
    ended.hidden = orphans === 0;
    row.append(swatch, name, now, more, spark, details);
    const strays = nb.stray_contexts ?? [];
    if (strays.length) {
      // The daemon's flags, in its words: what it is, why, how to avoid it.
      const box = el('div', 'jp-gpumem-strays');
      for (const sc of strays) {
        const w = el('div', 'jp-gpumem-stray', trans.__('GPU %1, pid %2: %3', sc.gpu, sc.pid, sc.label));
        w.title = `${sc.why} ${sc.avoid}`;
        w.dataset.gpumem = 'stray-context';
        box.appendChild(w);
      }
      row.appendChild(box);
    }
    return row;
  }

  /**
   * A notebook's GPU work under its row: its SM utilization now ("unknown"
   * where the GPU cannot say, never 0), the daemon's verdict on hover, and
   * a sparkline of SM % over the plot's window with a gap where unknown.
   */
  private _workLine(
    row: HTMLLIElement,
    nb: Notebook,
    points: Map<number, number> | undefined,
    from: number,
    to: number,
    step: number
  ): void {
    const trans = this._trans;
    const work = el('span', 'jp-gpumem-work', formatUtil(nb.utilization, trans));
    work.dataset.gpumem = 'gpu-work';
    work.dataset.state = nb.compute?.state ?? '';
    const verdicts: Record<string, string> = {
      computing: trans.__('computing on a GPU'),
      idle: trans.__('computing nothing on a GPU'),
      unknown: trans.__('GPU work unknown')
    };
    work.title = nb.compute
      ? [verdicts[nb.compute.state] ?? nb.compute.state, nb.compute.reason].filter(Boolean).join(': ')
      : trans.__('SM utilization of the kernel and its children, summed over its GPUs');
    const spark = document.createElementNS(SVG, 'svg');
    spark.classList.add('jp-gpumem-spark', 'jp-gpumem-spark-sm');
    spark.setAttribute('viewBox', '0 0 100 14');
    spark.setAttribute('preserveAspectRatio', 'none');
    spark.setAttribute('aria-hidden', 'true');
    const title = document.createElementNS(SVG, 'title');
    title.textContent = trans.__("%1's SM utilization over the plot's window", nb.display_name);
    spark.appendChild(title);
    const path = document.createElementNS(SVG, 'path');
    const top = Math.max(100, ...(points ? [...points.values()] : []));
    path.setAttribute('d', sparkPath(points, from, to, 100, 14, top, Math.max(1, step)));
    path.setAttribute('stroke', this._color(nb.kernel_id));
    spark.appendChild(path);
    row.append(work, spark);
  }

  /** A notebook's actions menu: JupyterLab's commands, with their labels and captions. */
  private _menu(kernelId: string): Menu {
    const menu = new Menu({ commands: this._actions.commands });
    menu.addClass('jp-gpumem-menu');
    for (const command of NOTEBOOK_COMMANDS) {
      menu.addItem({ command, args: { kernelId } });
    }
    menu.aboutToClose.connect(() => setTimeout(() => menu.dispose(), 0));
    return menu;
  }

  /** Frees cache (only) in a kernel and says what it returned. */
  async freeCache(kernelId: string): Promise<void> {
    const trans = this._trans;
    const label = this._label(kernelId);
    try {
      const r = await freeCache(kernelId);
      if (r.status !== 'ok') {
        Notification.warning(trans.__('Free cache in %1: %2', label, r.message ?? trans.__('failed')), { autoClose: 8000 });
        return;
      }
      // The daemon judged what went back to the GPU: shown as it says it.
      const free = r.free as { returned?: boolean; summary?: string } | undefined;
      const msg = trans.__('Free cache in %1: %2', label, free?.summary || trans.__('done'));
      if (free?.returned) {
        Notification.success(msg, { autoClose: 6000 });
      } else {
        Notification.info(msg, { autoClose: 10000 });
      }
      void this._source.refresh();
    } catch (e) {
      Notification.error(trans.__('Free cache in %1 failed: %2', label, String(e)), { autoClose: 8000 });
    }
  }

  /** Shows the variables holding GPU memory in a kernel (%gpumem vars), or what other devices hold. */
  async showVariables(kernelId: string): Promise<void> {
    const trans = this._trans;
    const label = this._label(kernelId);
    const box = this._vars;
    const note = el('div', 'jp-gpumem-empty', trans.__('Reading…'));
    box.replaceChildren(el('h3', '', trans.__('Variables of %1', label)), note);
    let rows;
    try {
      let r = await fetchVars(kernelId);
      let onGPU = true;
      if (r.status === 'ok' && !varRows(r.vars).length) {
        // Nothing on a GPU: show what other devices hold, and say so.
        r = await fetchVars(kernelId, true);
        onGPU = false;
      }
      if (r.status !== 'ok') {
        note.textContent = r.message ?? trans.__('Reading the variables failed.');
        return;
      }
      rows = varRows(r.vars);
      if (!rows.length) {
        note.textContent = trans.__('No variable holds memory, on a GPU or on any other device.');
        return;
      }
      note.textContent = onGPU ? '' : trans.__('No variable holds GPU memory. These hold memory on other devices:');
      note.hidden = onGPU;
    } catch (e) {
      note.textContent = trans.__('Reading the variables failed: %1', String(e));
      return;
    }
    const table = headedTable('jp-gpumem-table', 'vars-table', [trans.__('name'), trans.__('type'), trans.__('device'), trans.__('bytes')]);
    for (const r of rows) {
      const tr = el('tr');
      const name = el('td', r.hidden ? 'jp-gpumem-hidden jp-gpumem-cut' : 'jp-gpumem-cut', r.name);
      name.title = r.name;
      tr.append(
        name,
        el('td', 'jp-gpumem-cut', r.type),
        el('td', 'jp-gpumem-cut', r.device),
        el('td', 'jp-gpumem-num', formatBytes(r.bytes))
      );
      table.appendChild(tr);
    }
    box.appendChild(table);
    box.scrollIntoView({ block: 'nearest' });
  }

  /** %gpumem why of a kernel: every byte of its GPU memory, who holds it and the fix, as the daemon renders it. */
  async showWhy(kernelId: string): Promise<void> {
    const trans = this._trans;
    const label = this._label(kernelId);
    const box = this._vars;
    const pre = el('pre', 'jp-gpumem-why', trans.__('Reading…'));
    pre.dataset.gpumem = 'why';
    box.replaceChildren(el('h3', '', trans.__('Why: %1', label)), pre);
    try {
      const r = await fetchWhy(kernelId);
      pre.textContent = r.status === 'ok' ? ((r.why as { text?: string } | undefined)?.text ?? '') : (r.message ?? trans.__('failed'));
    } catch (e) {
      pre.textContent = trans.__('Reading why failed: %1', String(e));
    }
    box.scrollIntoView({ block: 'nearest' });
  }

  /**
   * Ends a kernel's GPU-holding worker processes (never the kernel) and
   * says what it returned. A worker that computes (or whose work is
   * unknown) is ended only if the user confirms it (workers.ts).
   */
  async freeWorkers(kernelId: string): Promise<void> {
    const trans = this._trans;
    const label = this._label(kernelId);
    const plan = planFreeWorkers(this._source.state?.notebooks.find(n => n.kernel_id === kernelId));
    let choice: FreeWorkersChoice = 'idle';
    if (plan.busy.length > 0) {
      const body = el('div', 'jp-gpumem-confirm');
      body.append(
        el(
          'p',
          '',
          trans.__('These workers of %1 compute on a GPU, or whether they do is unknown; ending them may lose their work:', label)
        )
      );
      for (const line of busyLines(plan.busy, trans)) {
        body.append(el('div', '', line));
      }
      const answer = await showDialog({
        title: trans.__('Free workers of %1', label),
        body: new Widget({ node: body }),
        buttons: [
          Dialog.cancelButton({ label: trans.__('Cancel') }),
          Dialog.okButton({ label: trans.__('Free idle workers only') }),
          Dialog.warnButton({ label: trans.__('End them too') })
        ]
      });
      choice = choiceOf(answer.button);
    }
    const pids = pidsToConfirm(plan, choice);
    if (pids === null) {
      return;
    }
    try {
      const r = await freeChildren(kernelId, pids);
      if (r.status !== 'ok') {
        Notification.warning(trans.__('Free workers of %1: %2', label, r.message ?? trans.__('failed')), { autoClose: 8000 });
        return;
      }
      const rep = r.children as
        { ended?: unknown[]; left?: { confirm?: boolean; message?: string }[]; returned_bytes?: number } | undefined;
      const ended = rep?.ended?.length ?? 0;
      const running = (rep?.left ?? []).filter(p => p.confirm && p.message).map(p => p.message as string);
      let msg = trans._n(
        'Free workers of %2: ended %1 worker process, %3 returned',
        'Free workers of %2: ended %1 worker processes, %3 returned',
        ended,
        label,
        formatBytes(rep?.returned_bytes ?? 0)
      );
      if (running.length > 0) {
        msg += '; ' + trans.__('left running: %1', running.join('; '));
      }
      if (ended > 0) {
        Notification.success(msg, { autoClose: 6000 });
      } else {
        Notification.info(msg, { autoClose: 10000 });
      }
      void this._source.refresh();
    } catch (e) {
      Notification.error(trans.__('Free workers of %1 failed: %2', label, String(e)), { autoClose: 8000 });
    }
  }

  /** Shows an out-of-memory report at the top, with its snapshots when there are. */
  showOOM(ev: OOMEvent): void {
    const trans = this._trans;
    const name = kernelLabel(this._source.state, ev.kernel_id, ev.notebook, trans);
    const box = this._openReport(trans.__('Out of memory in %1', name));
    box.appendChild(reportNode(ev, trans));
    void fetchSnapshots(ev.kernel_id)
      .then(r => {
        const list = ((r as { snapshots?: { snapshots?: { id: string; oom_event?: number }[] } }).snapshots?.snapshots ?? []).filter(
          s => s.oom_event === ev.seq
        );
        for (const s of list) {
          const b = el('button', 'jp-mod-styled jp-gpumem-report-button', trans.__('Open the memory snapshot'));
          b.dataset.action = 'Open snapshot';
          b.onclick = () => void this.showSnapshot(ev.kernel_id, s.id, ev.notebook);
          box.appendChild(b);
        }
      })
      .catch(() => undefined);
  }

  /** Draws a memory snapshot at the top (when the daemon has reduced it). */
  async showSnapshot(kernelId: string, id: string, notebook = ''): Promise<void> {
    const trans = this._trans;
    const name = kernelLabel(this._source.state, kernelId, notebook, trans);
    const box = this._openReport(trans.__('Memory snapshot %1 of %2', id, name));
    const body = el('div', 'jp-gpumem-empty', trans.__('Reading…'));
    box.appendChild(body);
    try {
      const r = await fetchSnapshot(kernelId, id);
      const s = (r as { snapshot?: { snapshot: { status: string; error?: string }; reduction: SnapshotReduction | null } }).snapshot;
      if (r.status !== 'ok' || !s) {
        body.textContent = r.message ?? trans.__('failed');
        return;
      }
      if (!s.reduction) {
        body.textContent =
          s.snapshot.status === 'failed'
            ? trans.__('gpumem serve could not read it: %1', s.snapshot.error ?? '')
            : trans.__('gpumem serve is still reducing it…');
        return;
      }
      const t0 = performance.now();
      // The plot's width is the report's: it fits the sidebar.
      await drawSnapshot(body, s.reduction, snapshotRawUrl(kernelId, id), Math.max(120, body.clientWidth), trans);
      body.dataset.drawMs = String(Math.round(performance.now() - t0));
    } catch (e) {
      body.textContent = trans.__('Reading the snapshot failed: %1', String(e));
    }
  }

  private _openReport(title: string): HTMLDivElement {
    const trans = this._trans;
    const r = this._report;
    r.replaceChildren();
    r.hidden = false;
    const head = el('div', 'jp-gpumem-report-title');
    head.append(el('h3', '', title));
    const close = el('button', 'jp-gpumem-more jp-Button jp-mod-minimal', '✕');
    close.setAttribute('aria-label', trans.__('Close the report'));
    close.title = trans.__('Close');
    close.onclick = () => {
      r.hidden = true;
      r.replaceChildren();
    };
    head.appendChild(close);
    const box = el('div', 'jp-gpumem-report-body');
    r.append(head, box);
    r.scrollIntoView({ block: 'nearest' });
    return box;
  }

  /** A kernel's name for messages: the daemon's display name of its notebook. */
  private _label(kernelId: string): string {
    return kernelLabel(this._source.state, kernelId, '', this._trans);
  }

  private _renderOthers(state: State): void {
    const trans = this._trans;
    const box = this._others;
    box.replaceChildren();
    if (!state.others.length) {
      return;
    }
    box.appendChild(el('h3', '', trans.__('Everyone else')));
    const list = el('ul', 'jp-gpumem-rows');
    for (const u of state.others) {
      const row = el('li', 'jp-gpumem-row jp-gpumem-user');
      const name = el('span', 'jp-gpumem-name', u.user);
      const what = [
        trans._n('%1 notebook', '%1 notebooks', u.notebooks),
        trans._n('%1 other process', '%1 other processes', u.other_processes)
      ].join(', ');
      name.title = trans.__('user %1: %2', u.user, what);
      const details = el('span', 'jp-gpumem-details', what);
      row.append(
        el('span', 'jp-gpumem-swatch jp-gpumem-swatch-other'),
        name,
        el('span', 'jp-gpumem-figure', formatBytes(u.gpu_memory_bytes)),
        details
      );
      list.appendChild(row);
    }
    box.appendChild(list);
  }
}

function themeKey(t: PlotTheme): string {
  return `${t.text}/${t.grid}/${t.used}`;
}

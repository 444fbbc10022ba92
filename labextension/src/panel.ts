// The "GPU memory" side panel: per GPU its use and a live stacked plot of
// the last 15 minutes per notebook (uPlot), this server's notebooks with
// their figure, peak, processes and ended orphans, and buttons; other
// users as totals. It draws what the state source holds: no request of its
// own except the buttons'.

import { Notification } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';
import type uPlot from 'uplot';

import { fetchVars, freeCache } from './api';
import { formatBytes, formatPercent, levelFor } from './format';
import { GPU, Notebook, notebookLabel, stackNotebooks, State, varRows } from './model';
import { StateSource } from './source';

/** What the panel needs from the application for its buttons. */
export interface PanelActions {
  open(path: string): void;
  /** JupyterLab's restart (with its confirmation); false when the notebook is not open here. */
  restart(kernelId: string): Promise<boolean>;
  canRestart(kernelId: string): boolean;
}

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

function el<K extends keyof HTMLElementTagNameMap>(tag: K, cls = '', text = ''): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  if (cls) {
    e.className = cls;
  }
  if (text) {
    e.textContent = text;
  }
  return e;
}

export class GpuPanel extends Widget {
  private _status = el('div', 'jp-gpumem-panel-status');
  private _daemon = el('div', 'jp-gpumem-daemon');
  private _gpus = el('div', 'jp-gpumem-gpus');
  private _notebooks = el('div', 'jp-gpumem-notebooks');
  private _others = el('div', 'jp-gpumem-others');
  private _vars = el('div', 'jp-gpumem-vars');
  private _plots = new Map<number, { box: HTMLDivElement; head: HTMLDivElement; plot: uPlot | null; ids: string }>();
  private _colors = new Map<string, string>();

  constructor(
    private _source: StateSource,
    private _actions: PanelActions
  ) {
    super();
    this.id = 'jp-gpumem-panel';
    this.addClass('jp-gpumem-panel');
    this.title.caption = 'GPU memory';
    this._status.dataset.gpumem = 'panel-status';
    this._daemon.dataset.gpumem = 'daemon-status';
    this._vars.dataset.gpumem = 'vars';
    this.node.append(this._daemon, this._status, this._gpus, this._notebooks, this._others, this._vars);
    _source.changed.connect(() => {
      if (this.isVisible) {
        this.update();
      }
    });
  }

  protected onAfterShow(): void {
    this.update();
  }

  protected onResize(): void {
    for (const p of this._plots.values()) {
      p.plot?.setSize({ width: this._plotWidth(), height: 140 });
    }
  }

  private _plotWidth(): number {
    return Math.max(200, this.node.clientWidth - 24);
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
    if (!state) {
      this._status.textContent = this._source.unavailable ?? 'Waiting for gpumem serve…';
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
    const UPlot = uPlotClass;
    if (!UPlot) {
      void loadUPlot().then(() => this.update());
      return;
    }
    const seen = new Set<number>();
    for (const g of state.gpus) {
      seen.add(g.index);
      let p = this._plots.get(g.index);
      if (!p) {
        const box = el('div', 'jp-gpumem-gpu');
        box.dataset.gpu = String(g.index);
        const head = el('div', 'jp-gpumem-gpu-head');
        box.appendChild(head);
        this._gpus.appendChild(box);
        p = { box, head, plot: null, ids: '' };
        this._plots.set(g.index, p);
      }
      this._renderGPUHead(p.head, g, state);
      const st = stackNotebooks(this._source.history, state.notebooks, g.index, state.step_seconds);
      const ids = st.stacks.map(s => s.kernelId).join(',');
      // Draw the top of the stack first so that lower bands cover it.
      const order = [...st.stacks].reverse();
      const data = [st.times, ...order.map(s => s.values)] as uPlot.AlignedData;
      // The newest top of the stack: what the plot shows last, for tests.
      const top = order.length ? order[0].values[order[0].values.length - 1] : 0;
      p.box.dataset.stackTop = String(top ?? 0);
      if (!p.plot || p.ids !== ids) {
        p.plot?.destroy();
        const opts: uPlot.Options = {
          width: this._plotWidth(),
          height: 140,
          legend: { show: true, live: false },
          cursor: { show: false },
          scales: { y: { range: (_u, _min, max) => [0, Math.max(max, 1)] } },
          axes: [
            {},
            { values: (_u, vals) => vals.map(v => formatBytes(v)), size: 70 }
          ],
          series: [
            {},
            ...order.map(s => ({
              label: s.label,
              stroke: this._color(s.kernelId),
              fill: this._color(s.kernelId) + '99',
              width: 1,
              points: { show: false }
            }))
          ]
        };
        p.plot = new UPlot(opts, data, p.box);
        p.ids = ids;
      } else {
        p.plot.setData(data);
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

  private _renderGPUHead(head: HTMLDivElement, g: GPU, state: State): void {
    head.replaceChildren();
    const title = el('div', 'jp-gpumem-gpu-title', `GPU ${g.index} · ${g.name}${g.simulated ? ' (simulated)' : ''}`);
    const fig = el(
      'div',
      'jp-gpumem-gpu-figure',
      `${formatBytes(g.memory_used_bytes)} / ${formatBytes(g.memory_total_bytes)} used (${formatPercent(g.memory_used_bytes, g.memory_total_bytes)})`
    );
    fig.dataset.gpumem = 'gpu-figure';
    const bar = el('span', 'jp-gpumem-bar jp-gpumem-bar-wide');
    const fill = el('span', 'jp-gpumem-bar-fill');
    fill.style.width = `${Math.min(100, (100 * g.memory_used_bytes) / Math.max(g.memory_total_bytes, 1)).toFixed(1)}%`;
    bar.dataset.level = levelFor(g.memory_used_bytes, g.memory_total_bytes, state.alert_threshold);
    bar.appendChild(fill);
    head.append(title, fig, bar);
  }

  private _renderNotebooks(state: State): void {
    const box = this._notebooks;
    box.replaceChildren(el('h3', '', 'Notebooks of this server'));
    if (!state.notebooks.length) {
      box.appendChild(el('div', 'jp-gpumem-empty', 'No kernel of this server is followed by gpumem serve.'));
      return;
    }
    const orphans = this._source.reclaimed;
    const table = el('table', 'jp-gpumem-table');
    table.title = 'now: GPU memory of the kernel and its children (driver figure); peak: since the kernel started; orphans: processes of an earlier kernel process that gpumem serve ended';
    const head = el('tr');
    for (const h of ['notebook', 'now', 'peak', 'procs', 'orphans']) {
      head.appendChild(el('th', '', h));
    }
    table.appendChild(head);
    const rows = [...state.notebooks].sort((a, b) => b.gpu_memory_bytes - a.gpu_memory_bytes || a.kernel_id.localeCompare(b.kernel_id));
    for (const nb of rows) {
      const [tr, actions] = this._notebookRow(nb, orphans.get(nb.kernel_id) ?? 0);
      table.append(tr, actions);
    }
    box.appendChild(table);
  }

  private _notebookRow(nb: Notebook, orphans: number): [HTMLTableRowElement, HTMLTableRowElement] {
    const tr = el('tr');
    tr.dataset.kernelId = nb.kernel_id;
    tr.dataset.gpumem = 'notebook-row';
    const name = el('td', 'jp-gpumem-name', notebookLabel(nb));
    name.title = nb.path || nb.notebook;
    const swatch = el('span', 'jp-gpumem-swatch');
    swatch.style.background = this._color(nb.kernel_id);
    name.prepend(swatch);
    tr.append(
      name,
      el('td', 'jp-gpumem-num', formatBytes(nb.gpu_memory_bytes)),
      el('td', 'jp-gpumem-num', nb.peak_bytes !== undefined ? formatBytes(nb.peak_bytes) : '—'),
      el('td', 'jp-gpumem-num', String(Math.max(nb.processes.length, nb.pids.length ? 1 : 0))),
      el('td', 'jp-gpumem-num', String(orphans))
    );
    // The buttons go on a row of their own: the panel is narrow.
    const actionRow = el('tr', 'jp-gpumem-actions-row');
    actionRow.dataset.kernelId = nb.kernel_id;
    actionRow.dataset.gpumem = 'notebook-actions';
    const actions = el('td', 'jp-gpumem-actions');
    actions.colSpan = 5;
    actionRow.appendChild(actions);
    const button = (label: string, title: string, run: (b: HTMLButtonElement) => Promise<void>) => {
      const b = el('button', 'jp-mod-styled jp-gpumem-button', label);
      b.title = title;
      b.dataset.action = label;
      b.onclick = async () => {
        b.disabled = true;
        try {
          await run(b);
        } finally {
          b.disabled = false;
        }
      };
      actions.appendChild(b);
      return b;
    };
    button('Free cache', 'gc and empty the frameworks\' caches in this kernel, after its current cell; no variable is deleted', () =>
      this._free(nb)
    );
    button('Variables', 'The variables holding GPU memory (%gpumem vars), read without running anything in the notebook', () =>
      this._showVars(nb)
    );
    const rb = button('Restart kernel', 'Restart the kernel (JupyterLab asks first)', async () => {
      await this._actions.restart(nb.kernel_id);
    });
    if (!this._actions.canRestart(nb.kernel_id)) {
      rb.disabled = true;
      rb.title = 'Open the notebook in this window to restart its kernel';
      rb.onclick = null;
    }
    const ob = button('Open', 'Open the notebook', async () => this._actions.open(nb.path));
    if (!nb.path) {
      ob.disabled = true;
      ob.onclick = null;
    }
    return [tr, actionRow];
  }

  private async _free(nb: Notebook): Promise<void> {
    const label = notebookLabel(nb);
    try {
      const r = await freeCache(nb.kernel_id);
      if (r.status !== 'ok') {
        Notification.warning(`Free cache in ${label}: ${r.message ?? 'failed'}`, { autoClose: 8000 });
        return;
      }
      const drv = (r.free as { driver?: { before: number; after: number } } | undefined)?.driver;
      const msg = drv
        ? `Freed cache in ${label}: ${formatBytes(drv.before)} → ${formatBytes(drv.after)} on the GPU`
        : `Freed cache in ${label}`;
      Notification.success(msg, { autoClose: 6000 });
      void this._source.refresh();
    } catch (e) {
      Notification.error(`Free cache in ${label} failed: ${String(e)}`, { autoClose: 8000 });
    }
  }

  private async _showVars(nb: Notebook): Promise<void> {
    const box = this._vars;
    box.replaceChildren(el('h3', '', `Variables of ${notebookLabel(nb)}`), el('div', 'jp-gpumem-empty', 'Reading…'));
    let rows;
    try {
      let r = await fetchVars(nb.kernel_id);
      if (r.status === 'ok' && !varRows(r.vars).length) {
        // Nothing on a GPU: say so, and show what other devices hold.
        box.lastElementChild!.textContent = 'No variable holds GPU memory. On other devices:';
        r = await fetchVars(nb.kernel_id, true);
      } else {
        box.lastElementChild!.remove();
      }
      if (r.status !== 'ok') {
        box.appendChild(el('div', 'jp-gpumem-empty', r.message ?? 'failed'));
        return;
      }
      rows = varRows(r.vars);
      const notes = (r.vars as { notes?: string[] }).notes ?? [];
      if (!rows.length) {
        box.appendChild(el('div', 'jp-gpumem-empty', notes.join(' ') || 'No variable holds memory on any device.'));
        return;
      }
    } catch (e) {
      box.lastElementChild!.textContent = `Reading the variables failed: ${String(e)}`;
      return;
    }
    const table = el('table', 'jp-gpumem-table');
    table.dataset.gpumem = 'vars-table';
    const head = el('tr');
    for (const h of ['name', 'type', 'device', 'bytes']) {
      head.appendChild(el('th', '', h));
    }
    table.appendChild(head);
    for (const r of rows) {
      const tr = el('tr');
      tr.append(
        el('td', r.hidden ? 'jp-gpumem-hidden' : '', r.name),
        el('td', '', r.type),
        el('td', '', r.device),
        el('td', 'jp-gpumem-num', formatBytes(r.bytes))
      );
      table.appendChild(tr);
    }
    box.appendChild(table);
  }

  private _renderOthers(state: State): void {
    const box = this._others;
    box.replaceChildren();
    if (!state.others.length) {
      return;
    }
    box.appendChild(el('h3', '', 'Everyone else (per user)'));
    const table = el('table', 'jp-gpumem-table');
    const head = el('tr');
    for (const h of ['user', 'notebooks', 'other processes', 'memory']) {
      head.appendChild(el('th', '', h));
    }
    table.appendChild(head);
    for (const u of state.others) {
      const tr = el('tr');
      tr.append(
        el('td', '', u.user),
        el('td', 'jp-gpumem-num', String(u.notebooks)),
        el('td', 'jp-gpumem-num', String(u.processes)),
        el('td', 'jp-gpumem-num', formatBytes(u.bytes))
      );
      table.appendChild(tr);
    }
    box.appendChild(table);
  }
}

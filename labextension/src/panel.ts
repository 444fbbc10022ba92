// The "GPU memory" side panel, laid out for a sidebar of 250 to 600 px: a
// heading with the plot window's selector; per GPU its use and a plot of
// this server's notebooks on it (panel_plots.ts); one compact row per
// notebook and other users as totals (panel_rows.ts); the variables of a
// notebook, its "why", and the notebook actions' results (here); an
// out-of-memory report and memory snapshot when asked (panel_reports.ts).
// It draws what the state source holds: no request of its own but its
// actions'.

import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { JupyterFrontEnd } from '@jupyterlab/application';
import { Widget } from '@lumino/widgets';

import { fetchVars, fetchWhy, freeCache, freeChildren } from './api';
import { el } from './dom';
import { formatBytes, plainTrans, Trans } from './format';
import { kernelLabel, mainGPU, varRows, WINDOWS } from './model';
import { OOMEvent } from './oom';
import { GpuPlots, Palette } from './panel_plots';
import { NotebookRows, OtherUsers } from './panel_rows';
import { ReportArea } from './panel_reports';
import { StateSource } from './source';
import { listNode, viewHead, ViewHead } from './view';
import { whyFoot, whyRows, WhyData } from './why';
import { busyLines, choiceOf, FreeWorkersChoice, pidsToConfirm, planFreeWorkers } from './workers';

export { NOTEBOOK_COMMANDS } from './panel_rows';

/** What the panel needs from the application. */
export interface PanelActions {
  commands: JupyterFrontEnd['commands'];
  /** The plot window chosen in the panel, in seconds (saved as a setting). */
  setWindow(seconds: number): void;
}

export class GpuPanel extends Widget {
  private _heading = el('h2', 'jp-gpumem-heading');
  private _window = el('select', 'jp-gpumem-window');
  private _windowLabel = el('label', 'jp-gpumem-window-label');
  private _status = el('div', 'jp-gpumem-panel-status');
  private _daemon = el('div', 'jp-gpumem-daemon');
  private _vars = el('section', 'jp-gpumem-vars');
  // An out-of-memory report or a memory snapshot, opened from a notification.
  private _report: ReportArea;
  private _plots: GpuPlots;
  private _rows: NotebookRows;
  private _others: OtherUsers;
  private _windowSeconds = 15 * 60;
  // The why view open now: its data, kept to drop the rows of workers that end.
  private _view: { kernelId: string; why: WhyData; body: HTMLElement } | null = null;

  constructor(
    private _source: StateSource,
    private _actions: PanelActions,
    private _trans: Trans = plainTrans
  ) {
    super();
    const trans = _trans;
    const palette = new Palette();
    this._report = new ReportArea(_source, _trans);
    this._plots = new GpuPlots(_source, palette, _trans, () => this.update());
    this._rows = new NotebookRows(_source, palette, _actions.commands, _trans);
    this._others = new OtherUsers(_trans);
    this.id = 'jp-gpumem-panel';
    this.addClass('jp-gpumem-panel');
    this.title.caption = trans.__('GPU memory');
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-label', trans.__('GPU memory'));
    this._heading.textContent = trans.__('GPU memory');
    const head = el('div', 'jp-gpumem-header');
    const label = this._windowLabel;
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
    this.node.append(head, this._daemon, this._status, this._report.node, this._plots.node, this._rows.node, this._others.node, this._vars);
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

  protected onUpdateRequest(): void {
    const daemon = this._source.daemon;
    this._daemon.textContent = daemon?.text ?? '';
    this._daemon.dataset.case = daemon?.case ?? '';
    const state = this._source.state;
    // Without a daemon the status line says the same sentence: said once.
    this._daemon.hidden = !daemon || (!state && (this._source.unavailable ?? '').includes(daemon.text));
    const trans = this._trans;
    // The plot window's selector only where there are plots.
    this._windowLabel.hidden = !state?.gpus.length;
    if (!state) {
      this._status.textContent = this._source.unavailable ?? trans.__('Waiting for the first figures from gpumem serve…');
      this._status.hidden = false;
      this._plots.node.hidden = this._rows.node.hidden = this._others.node.hidden = this._vars.hidden = true;
      return;
    }
    this._status.hidden = state.warnings.length === 0;
    // Without a GPU the warnings say why there is no figure, and the next step: as every face says it.
    this._status.textContent = state.gpus.length ? state.warnings.join('; ') : trans.__('GPU n/a: %1', state.warnings.join('; '));
    this._plots.node.hidden = this._rows.node.hidden = this._others.node.hidden = this._vars.hidden = false;
    this._plots.render(state, this._windowSeconds, this.node);
    this._rows.render(state, this._windowSeconds);
    this._others.render(state);
    this._renderWhy();
  }

  /** Frees cache (only) in a kernel and says what it returned. */
  async freeCache(kernelId: string): Promise<void> {
    const r = await this._freeCacheIn(kernelId);
    if (r.error) {
      Notification.error(r.text, { autoClose: 8000 });
    } else if (r.returned) {
      Notification.success(r.text, { autoClose: 6000 });
    } else {
      Notification.info(r.text, { autoClose: 10000 });
    }
    void this._source.refresh();
  }

  /** Frees cache in several kernels ("Free cache in my notebooks") and says, in one notification, what each returned. */
  async freeCacheMany(kernelIds: string[]): Promise<void> {
    const results = await Promise.all(kernelIds.map(k => this._freeCacheIn(k)));
    const text = results.map(r => r.text).join('\n');
    if (results.some(r => r.returned)) {
      Notification.success(text, { autoClose: 8000 });
    } else {
      Notification.info(text, { autoClose: 12000 });
    }
    void this._source.refresh();
  }

  /** Frees cache in a kernel: the daemon's sentence of what went back to the GPU (it measures after the free). */
  private async _freeCacheIn(kernelId: string): Promise<{ text: string; returned: boolean; error: boolean }> {
    const trans = this._trans;
    const label = this._label(kernelId);
    try {
      const r = await freeCache(kernelId);
      if (r.status !== 'ok') {
        return { text: trans.__('Free cache in %1: %2', label, r.message ?? trans.__('failed')), returned: false, error: false };
      }
      const free = r.free as { returned?: boolean; summary?: string } | undefined;
      return {
        text: trans.__('Free cache in %1: %2', label, free?.summary || trans.__('done')),
        returned: Boolean(free?.returned),
        error: false
      };
    } catch (e) {
      return { text: trans.__('Free cache in %1 failed: %2', label, String(e)), returned: false, error: true };
    }
  }

  /**
   * Says, once gpumem serve has sampled after since (unix seconds), what
   * say makes of the kernel's GPU figures then: the driver's figure once
   * the process has exited, not the one before. Within 5 s, else with
   * the last figures and says so.
   */
  async saySince(since: number, kernelId: string, say: (now: string) => string): Promise<void> {
    const trans = this._trans;
    const state = await this._source.sampleAfter(since, 5000);
    const nb = state?.notebooks.find(n => n.kernel_id === kernelId);
    const g = state && mainGPU(state, nb);
    let now: string;
    if (!state) {
      now = trans.__('no figure since (gpumem serve did not answer)');
    } else if (g) {
      now = trans.__('GPU %1 now %2 of %3 used', g.index, formatBytes(g.memory_used_bytes), formatBytes(g.memory_total_bytes));
    } else {
      now = trans.__('no GPU figure');
    }
    Notification.success(say(now), { autoClose: 8000 });
  }

  /** Shows the variables holding GPU memory in a kernel (%gpumem vars), or what other devices hold. */
  async showVariables(kernelId: string): Promise<void> {
    const trans = this._trans;
    const label = this._label(kernelId);
    const box = this._vars;
    const note = el('div', 'jp-gpumem-empty', trans.__('Reading…'));
    const head = this._viewHead(trans.__('Variables of %1', label), () => void this.showVariables(kernelId));
    box.replaceChildren(head.node, note);
    this._view = null;
    let rows;
    try {
      let r = await fetchVars(kernelId);
      let onGPU = true;
      if (r.status === 'ok' && !varRows(r.vars).length) {
        // Nothing on a GPU: show what other devices hold, and say so.
        r = await fetchVars(kernelId, true);
        onGPU = false;
      }
      head.asOf(Date.now() / 1000);
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
    box.appendChild(
      listNode(
        'vars-table',
        rows.map(r => ({
          name: r.name,
          bytes: formatBytes(r.bytes),
          sub: [r.type, r.device].filter(Boolean).join(' · '),
          nameCls: r.hidden ? 'jp-gpumem-hidden' : ''
        }))
      )
    );
    box.scrollIntoView({ block: 'nearest' });
  }

  /**
   * %gpumem why of a kernel: every byte of its GPU memory, who holds it and
   * the fix, a row each (the fix on its own line), then the daemon's lines
   * under them. A worker that has ended since is dropped at the next
   * sample (whyRows); refresh asks the kernel and the daemon again.
   */
  async showWhy(kernelId: string): Promise<void> {
    const trans = this._trans;
    const label = this._label(kernelId);
    const box = this._vars;
    const body = el('div', 'jp-gpumem-why');
    body.dataset.gpumem = 'why';
    body.appendChild(el('div', 'jp-gpumem-empty', trans.__('Reading…')));
    const head = this._viewHead(trans.__('Why: %1', label), () => void this.showWhy(kernelId));
    box.replaceChildren(head.node, body);
    this._view = null;
    try {
      const r = await fetchWhy(kernelId);
      head.asOf(Date.now() / 1000);
      if (r.status !== 'ok') {
        body.replaceChildren(el('div', 'jp-gpumem-empty', r.message ?? trans.__('failed')));
        return;
      }
      this._view = { kernelId, why: (r.why ?? {}) as WhyData, body };
      this._renderWhy();
    } catch (e) {
      body.replaceChildren(el('div', 'jp-gpumem-empty', trans.__('Reading why failed: %1', String(e))));
    }
    box.scrollIntoView({ block: 'nearest' });
  }

  /** Draws the open why view's rows, less the workers that have ended since it was read. */
  private _renderWhy(): void {
    const v = this._view;
    if (!v) {
      return;
    }
    const nb = this._source.state?.notebooks.find(n => n.kernel_id === v.kernelId);
    const { rows, ended } = whyRows(v.why, nb, this._trans);
    const key = `${rows.length}|${ended.join(',')}`;
    if (v.body.dataset.drawn === key) {
      return;
    }
    v.body.dataset.drawn = key;
    const parts: HTMLElement[] = [];
    parts.push(
      rows.length
        ? listNode('why-rows', rows)
        : el('div', 'jp-gpumem-empty', this._trans.__('No framework holds GPU memory in this kernel.'))
    );
    for (const line of whyFoot(v.why.text ?? '')) {
      parts.push(el('div', 'jp-gpumem-list-sub', line));
    }
    if (ended.length) {
      const gone = el(
        'div',
        'jp-gpumem-list-sub',
        this._trans._n(
          'pid %2 has ended since: its row is gone; ↻ reads the figures again',
          'pids %2 have ended since: their rows are gone; ↻ reads the figures again',
          ended.length,
          ended.join(', ')
        )
      );
      gone.dataset.gpumem = 'why-ended';
      parts.push(gone);
    }
    v.body.replaceChildren(...parts);
  }

  /** A view's head in the panel's view area: closing it empties the area. */
  private _viewHead(title: string, refresh: () => void): ViewHead {
    return viewHead(
      title,
      this._trans,
      () => {
        this._view = null;
        this._vars.replaceChildren();
      },
      refresh
    );
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
        | {
            ended?: unknown[];
            left?: { confirm?: boolean; message?: string }[];
            returned_bytes?: number;
            before?: number;
            after?: number;
            notes?: string[];
          }
        | undefined;
      const ended = rep?.ended?.length ?? 0;
      const running = (rep?.left ?? []).filter(p => p.confirm && p.message).map(p => p.message as string);
      let msg = trans._n(
        'Free workers of %2: ended %1 worker process, %3 returned',
        'Free workers of %2: ended %1 worker processes, %3 returned',
        ended,
        label,
        formatBytes(rep?.returned_bytes ?? 0)
      );
      // The daemon read the figure after once the ended processes were gone from the driver's list (or says why not).
      if (rep?.before !== undefined && rep?.after !== undefined) {
        msg += ' ' + trans.__("(the driver's figure for this kernel: %1 → %2)", formatBytes(rep.before), formatBytes(rep.after));
      }
      if (running.length > 0) {
        msg += '; ' + trans.__('left running: %1', running.join('; '));
      }
      if (rep?.notes?.length) {
        msg += '; ' + rep.notes.join('; ');
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
    this._report.showOOM(ev);
  }

  /** Draws a memory snapshot at the top (when the daemon has reduced it). */
  showSnapshot(kernelId: string, id: string, notebook = ''): Promise<void> {
    return this._report.showSnapshot(kernelId, id, notebook);
  }

  /** A kernel's name for messages: the daemon's display name of its notebook. */
  private _label(kernelId: string): string {
    return kernelLabel(this._source.state, kernelId, '', this._trans);
  }
}

// The status bar item: the current notebook's GPU memory (the driver's
// figure for its kernel and children) and a bar of its GPU with both parts
// plainly: this notebook (dark) and everyone else (light), amber past the
// alert threshold, red above 95%. With no figure to show it says "GPU n/a"
// and its tooltip says why. A click opens the panel. Resting the pointer
// on it reads the per-framework figures from the kernel (at most every
// 15 s: each read shows the kernel busy for a moment).

import { JupyterFrontEnd } from '@jupyterlab/application';
import { INotebookTracker } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { fetchSummary } from './api';
import { plainTrans, Trans } from './format';
import { notebookOf } from './model';
import { frameworkLines, statusView } from './status';
import { StateSource } from './source';

const SUMMARY_EVERY_MS = 15000;

export class GpuStatusItem extends Widget {
  private _name: HTMLSpanElement;
  private _label: HTMLSpanElement;
  private _bar: HTMLSpanElement;
  private _mine: HTMLSpanElement;
  private _rest: HTMLSpanElement;
  private _frameworks = new Map<string, { at: number; lines: string[] }>();

  constructor(
    private _source: StateSource,
    private _tracker: INotebookTracker,
    private _shell: JupyterFrontEnd.IShell,
    open: () => void,
    private _trans: Trans = plainTrans
  ) {
    super();
    this.addClass('jp-gpumem-status');
    this.node.setAttribute('data-gpumem', 'status');
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    this._name = document.createElement('span');
    this._name.className = 'jp-gpumem-status-name';
    this._label = document.createElement('span');
    this._label.className = 'jp-gpumem-status-label';
    this._bar = document.createElement('span');
    this._bar.className = 'jp-gpumem-bar';
    this._mine = document.createElement('span');
    this._mine.className = 'jp-gpumem-bar-fill';
    this._rest = document.createElement('span');
    this._rest.className = 'jp-gpumem-bar-fill jp-gpumem-bar-rest';
    this._bar.append(this._mine, this._rest);
    this.node.append(this._name, this._label, this._bar);
    _source.changed.connect(this.update, this);
    _tracker.currentChanged.connect(this.update, this);
    _shell.currentChanged?.connect(this.update, this);
    this.node.addEventListener('mouseenter', () => void this._loadFrameworks());
    this.node.addEventListener('click', open);
    this.node.addEventListener('keydown', e => {
      if (e.key === 'Enter' || e.key === ' ') {
        e.preventDefault();
        open();
      }
    });
    this.update();
  }

  /** The current tab's kernel; null when the current tab is not a notebook (the tracker keeps the last one). */
  private _kernelId(): string | undefined | null {
    const w = this._tracker.currentWidget;
    const current = this._shell.currentWidget;
    if (!w || (current && current !== w)) {
      return null;
    }
    return w.sessionContext.session?.kernel?.id;
  }

  protected onUpdateRequest(): void {
    const trans = this._trans;
    const kid = this._kernelId();
    const view = statusView(this._source.state, this._source.unavailable, kid, trans);
    this._label.textContent = view.text;
    this._name.textContent = view.name;
    this._name.title = view.name;
    this._name.hidden = !view.name;
    this._bar.hidden = !view.bar;
    this._mine.style.width = `${(100 * (view.bar?.mine ?? 0)).toFixed(1)}%`;
    this._rest.style.width = `${(100 * (view.bar?.rest ?? 0)).toFixed(1)}%`;
    this._bar.dataset.level = view.bar?.level ?? 'ok';
    const lines = [...view.lines];
    // Which daemon serves this server (started by it, shared, or none, and
    // why): the server extension's sentence.
    if (this._source.daemon) {
      lines.push(this._source.daemon.text);
    }
    this.node.dataset.daemon = this._source.daemon?.case ?? '';
    const fw = kid ? this._frameworks.get(kid) : undefined;
    if (view.bar && fw?.lines.length) {
      lines.push(trans.__('Frameworks (as the kernel reports them):'), ...fw.lines.map(l => '  ' + l));
    } else if (view.bar) {
      lines.push(trans.__('Rest the pointer here to read per-framework figures from the kernel.'));
    }
    lines.push(trans.__('Click to open the GPU memory panel.'));
    this.node.title = lines.join('\n');
    this.node.setAttribute('aria-label', `${view.name ? view.name + ': ' : ''}${view.text}. ${view.lines.join(' ')}`);
    this.node.dataset.kernelId = kid ?? '';
    const nb = this._source.state ? notebookOf(this._source.state, kid ?? undefined) : undefined;
    this.node.dataset.bytes = nb && view.bar ? String(nb.gpu_memory_bytes) : '';
  }

  private async _loadFrameworks(): Promise<void> {
    const kid = this._kernelId();
    const state = this._source.state;
    if (!kid || !state || !notebookOf(state, kid)) {
      return;
    }
    const have = this._frameworks.get(kid);
    if (have && Date.now() - have.at < SUMMARY_EVERY_MS) {
      return;
    }
    this._frameworks.set(kid, { at: Date.now(), lines: have?.lines ?? [] });
    try {
      const r = await fetchSummary(kid);
      if (r.status === 'ok') {
        this._frameworks.set(kid, { at: Date.now(), lines: frameworkLines(r.summary, this._trans) });
        this.update();
      }
    } catch {
      // The tooltip keeps the driver's figures; the next hover tries again.
    }
  }

  /** A plain text of the figure, for tests and screen readers. */
  get text(): string {
    return this._label.textContent ?? '';
  }
}

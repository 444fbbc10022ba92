// The status bar item: the current notebook's GPU memory (the driver's
// figure for its kernel and children), a small bar of its GPU's use against
// the total (amber past the alert threshold, red above 95%), and a tooltip
// with per-GPU figures, and per-framework ones read from the kernel when
// the pointer rests on the item (at most every 15 s: each read shows the
// kernel busy for a moment).

import { INotebookTracker } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { fetchSummary } from './api';
import { formatBytes, levelFor } from './format';
import { frameworkLines, mainGPU, notebookOf, tooltipLines } from './model';
import { StateSource } from './source';

const SUMMARY_EVERY_MS = 15000;

export class GpuStatusItem extends Widget {
  private _label: HTMLSpanElement;
  private _bar: HTMLSpanElement;
  private _fill: HTMLSpanElement;
  private _frameworks = new Map<string, { at: number; lines: string[] }>();

  constructor(
    private _source: StateSource,
    private _tracker: INotebookTracker
  ) {
    super();
    this.addClass('jp-gpumem-status');
    this.node.setAttribute('data-gpumem', 'status');
    this._label = document.createElement('span');
    this._label.className = 'jp-gpumem-status-label';
    this._bar = document.createElement('span');
    this._bar.className = 'jp-gpumem-bar';
    this._fill = document.createElement('span');
    this._fill.className = 'jp-gpumem-bar-fill';
    this._bar.appendChild(this._fill);
    this.node.append(this._label, this._bar);
    _source.changed.connect(this.update, this);
    _tracker.currentChanged.connect(this.update, this);
    this.node.addEventListener('mouseenter', () => void this._loadFrameworks());
    this.update();
  }

  private _kernelId(): string | undefined {
    return this._tracker.currentWidget?.sessionContext.session?.kernel?.id;
  }

  protected onUpdateRequest(): void {
    const state = this._source.state;
    if (!state) {
      this._label.textContent = 'GPU: —';
      this._fill.style.width = '0';
      this._bar.dataset.level = 'ok';
      this.node.title = this._source.unavailable ?? 'gpumem: waiting for the first figures';
      this.node.dataset.daemon = this._source.daemon?.case ?? '';
      return;
    }
    const kid = this._kernelId();
    const nb = notebookOf(state, kid);
    const gpu = mainGPU(state, nb);
    const sim = state.gpus.some(g => g.simulated) ? ' (simulated)' : '';
    this._label.textContent = nb ? `GPU ${formatBytes(nb.gpu_memory_bytes)}${sim}` : `GPU —${sim}`;
    if (gpu && gpu.memory_total_bytes > 0) {
      const ratio = Math.min(1, gpu.memory_used_bytes / gpu.memory_total_bytes);
      this._fill.style.width = `${(100 * ratio).toFixed(1)}%`;
      this._bar.dataset.level = levelFor(gpu.memory_used_bytes, gpu.memory_total_bytes, state.alert_threshold);
    }
    const lines = tooltipLines(state, nb);
    if (this._source.daemon) {
      lines.push(this._source.daemon.text);
    }
    this.node.dataset.daemon = this._source.daemon?.case ?? '';
    const fw = kid ? this._frameworks.get(kid) : undefined;
    if (fw && fw.lines.length) {
      lines.push('Frameworks (as the kernel reports them):', ...fw.lines.map(l => '  ' + l));
    } else if (nb) {
      lines.push('Rest the pointer here to read per-framework figures from the kernel.');
    }
    this.node.title = lines.join('\n');
    this.node.dataset.kernelId = kid ?? '';
    this.node.dataset.bytes = nb ? String(nb.gpu_memory_bytes) : '';
  }

  private async _loadFrameworks(): Promise<void> {
    const kid = this._kernelId();
    if (!kid || !notebookOf(this._source.state ?? ({ notebooks: [] } as never), kid)) {
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
        this._frameworks.set(kid, { at: Date.now(), lines: frameworkLines(r.summary) });
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

export { formatBytes };

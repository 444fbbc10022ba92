// The panel's report area, at its top: an out-of-memory report (with its
// memory snapshots) or a memory snapshot drawn, opened from a
// notification.

import { fetchSnapshot, fetchSnapshots, snapshotRawUrl } from './api';
import { el } from './dom';
import { clockTime, formatBytes, Trans } from './format';
import { viewHead, ViewHead } from './view';
import { kernelLabel } from './model';
import { drawSnapshot, OOMEvent, reportNode, SnapshotReduction } from './oom';
import { StateSource } from './source';

/** The report area, in node (hidden until a report opens). */
export class ReportArea {
  readonly node = el('section', 'jp-gpumem-report-area');

  constructor(
    private _source: StateSource,
    private _trans: Trans
  ) {
    this.node.hidden = true;
  }

  /** Shows an out-of-memory report, with its snapshots when there are. */
  showOOM(ev: OOMEvent): void {
    const trans = this._trans;
    const name = kernelLabel(this._source.state, ev.kernel_id, ev.notebook, trans);
    const now = el('div', 'jp-gpumem-list-sub');
    now.dataset.gpumem = 'oom-now';
    const { box, head } = this._open(trans.__('Out of memory in %1', name), () => this._oomNow(now, ev));
    // The report's figures are those of the error's moment: said so, and ↻ adds the GPU's now.
    head.asOf(ev.sampled_at ? ev.sampled_at / 1000 : ev.time, trans.__('figures of the error, read'));
    box.append(reportNode(ev, trans), now);
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
    const { box, head } = this._open(trans.__('Memory snapshot %1 of %2', id, name));
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
      head.asOf(Date.now() / 1000);
      const t0 = performance.now();
      // The plot's width is the report's: it fits the sidebar.
      await drawSnapshot(body, s.reduction, snapshotRawUrl(kernelId, id), Math.max(120, body.clientWidth), trans);
      body.dataset.drawMs = String(Math.round(performance.now() - t0));
    } catch (e) {
      body.textContent = trans.__('Reading the snapshot failed: %1', String(e));
    }
  }

  /** What the error's GPU and kernel hold now, from the last sample, under the report. */
  private _oomNow(line: HTMLElement, ev: OOMEvent): void {
    const trans = this._trans;
    const state = this._source.state;
    const g = state?.gpus.find(x => x.index === ev.gpu?.index);
    const nb = state?.notebooks.find(n => n.kernel_id === ev.kernel_id);
    const parts: string[] = [];
    if (g) {
      parts.push(trans.__('GPU %1: %2 of %3 used', g.index, formatBytes(g.memory_used_bytes), formatBytes(g.memory_total_bytes)));
    }
    parts.push(nb ? trans.__('%1 holds %2', nb.display_name, formatBytes(nb.gpu_memory_bytes)) : trans.__('its kernel is gone'));
    line.textContent = trans.__('now (%1): %2', clockTime(state?.now ?? Date.now() / 1000), parts.join('; '));
  }

  /** Empties the area, shows it under title with its head (close, and refresh when given), and returns its body. */
  private _open(title: string, refresh?: () => void): { box: HTMLDivElement; head: ViewHead } {
    const r = this.node;
    r.replaceChildren();
    r.hidden = false;
    const head = viewHead(
      title,
      this._trans,
      () => {
        r.hidden = true;
        r.replaceChildren();
      },
      refresh
    );
    const box = el('div', 'jp-gpumem-report-body');
    r.append(head.node, box);
    r.scrollIntoView({ block: 'nearest' });
    return { box, head };
  }
}

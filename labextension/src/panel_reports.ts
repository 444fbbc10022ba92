// The panel's report area, at its top: an out-of-memory report (with its
// memory snapshots) or a memory snapshot drawn, opened from a
// notification.

import { fetchSnapshot, fetchSnapshots, snapshotRawUrl } from './api';
import { el } from './dom';
import { Trans } from './format';
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
    const box = this._open(trans.__('Out of memory in %1', name));
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
    const box = this._open(trans.__('Memory snapshot %1 of %2', id, name));
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

  /** Empties the area, shows it under title with a close button, and returns its body. */
  private _open(title: string): HTMLDivElement {
    const trans = this._trans;
    const r = this.node;
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
}

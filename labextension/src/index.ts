// jupyterlab-gpumem: GPU memory by notebook, from gpumem serve, in a status
// bar item, a "GPU memory" side panel and notifications. One poll a tab
// feeds them all (source.ts).

import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ISessionContextDialogs, Notification, SessionContextDialogs } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { endOrphans, freeCache } from './api';
import { reclaimMessage } from './format';
import { alerts, cullWarnings, newAlerts } from './model';
import { LogEvent, newOOMs } from './oom';
import { GpuPanel } from './panel';
import { StateSource } from './source';
import { GpuStatusItem } from './statusbar';

import 'uplot/dist/uPlot.min.css';

const gpuIcon = new LabIcon({
  name: 'gpumem:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<path d="M4 7h16v10H4zM6 9v6h12V9zM7 4h2v3H7zm4 0h2v3h-2zm4 0h2v3h-2zM7 17h2v3H7zm4 0h2v3h-2zm4 0h2v3h-2z"/></g></svg>'
});

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyterlab-gpumem:plugin',
  description: 'GPU memory by notebook, from gpumem serve.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, ILabShell, ISessionContextDialogs],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null,
    labShell: ILabShell | null,
    dialogs: ISessionContextDialogs | null
  ) => {
    const source = new StateSource();
    const sessionDialogs = dialogs ?? new SessionContextDialogs();
    const panelOf = (kernelId: string) => tracker.find(w => w.sessionContext.session?.kernel?.id === kernelId);

    if (statusBar) {
      statusBar.registerStatusItem('jupyterlab-gpumem:status', {
        item: new GpuStatusItem(source, tracker),
        align: 'left',
        rank: 5,
        isActive: () => true
      });
    }

    const panel = new GpuPanel(source, {
      open: path => void app.commands.execute('docmanager:open', { path }),
      canRestart: kernelId => panelOf(kernelId) !== undefined,
      restart: async kernelId => {
        const w = panelOf(kernelId);
        return w ? sessionDialogs.restart(w.sessionContext) : false;
      }
    });
    panel.title.icon = gpuIcon;
    app.shell.add(panel, 'right', { rank: 900 });

    // GPU alerts: each shown once per crossing of the threshold.
    const shown = new Set<string>();
    source.changed.connect(() => {
      const state = source.state;
      if (!state) {
        return;
      }
      for (const a of newAlerts(alerts(state), shown)) {
        const actions = a.ownKernels.length
          ? [
              {
                label: 'Free cache in my notebooks',
                caption: 'gc and empty the frameworks\' caches in this server\'s notebooks on that GPU',
                callback: () => {
                  void Promise.allSettled(a.ownKernels.map(k => freeCache(k))).then(() => source.refresh());
                }
              }
            ]
          : [];
        Notification.warning(a.message, { autoClose: false, actions });
      }
    });
    // GPU-aware culling's warnings for this server's idle notebooks: each
    // shown once; running a cell cancels it (the daemon drops it).
    const warned = new Set<string>();
    source.changed.connect(() => {
      const state = source.state;
      if (!state) {
        return;
      }
      for (const w of cullWarnings(state)) {
        if (!warned.has(w.key)) {
          warned.add(w.key);
          Notification.warning(w.message, { autoClose: false });
        }
      }
    });
    // Orphans the daemon ended after a restart or shutdown, and jobs it
    // left running because they compute on a GPU (its sentence, and an
    // action that ends one).
    source.events.connect((_, events) => {
      for (const ev of events) {
        if (ev.kind === 'reclaim') {
          Notification.info(reclaimMessage(ev), { autoClose: 15000 });
        } else if (ev.kind === 'left_running' && ev.message && ev.pid) {
          const pid = ev.pid;
          Notification.warning(ev.message, {
            autoClose: false,
            actions: [
              {
                label: 'End it',
                caption: `End pid ${pid} (SIGTERM, then SIGKILL): its work is lost`,
                callback: () => {
                  void endOrphans(ev.kernel_id, [pid])
                    .then(r => {
                      const p = (r.end as { processes?: { ended: boolean; reason?: string }[] } | undefined)?.processes?.[0];
                      if (r.status !== 'ok' || !p?.ended) {
                        Notification.warning(`pid ${pid} was not ended: ${p?.reason ?? r.message ?? 'failed'}`, { autoClose: 8000 });
                      }
                    })
                    .finally(() => source.refresh());
                }
              }
            ]
          });
        }
      }
    });
    // Out-of-memory errors in this server's notebooks (each once), and
    // their memory snapshots once the daemon has reduced them.
    const ooms = new Set<number>();
    const openPanel = () => app.shell.activateById(panel.id);
    source.events.connect((_, events) => {
      for (const ev of newOOMs(events as LogEvent[], ooms)) {
        Notification.error(ev.headline, {
          autoClose: false,
          actions: [{ label: 'Open report', caption: 'Show the report in the GPU memory panel', callback: () => { openPanel(); panel.showOOM(ev); } }]
        });
      }
      for (const ev of events as LogEvent[]) {
        if (ev.kind === 'snapshot') {
          const name = ev.notebook ? ev.notebook.slice(ev.notebook.lastIndexOf('/') + 1) : `kernel ${ev.kernel_id.slice(0, 8)}`;
          Notification.info(`Memory snapshot of ${name} is ready`, {
            autoClose: 15000,
            actions: [{ label: 'Open', callback: () => { openPanel(); void panel.showSnapshot(ev.kernel_id, ev.reason, ev.notebook); } }]
          });
        }
      }
    });
    void labShell; // the panel lives in the right area of the lab shell when there is one
  }
};

export default plugin;

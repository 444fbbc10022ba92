// jupyterlab-gpumem: GPU memory by notebook, from gpumem serve, in a status
// bar item, a "GPU memory" side panel and notifications. One poll a tab
// feeds them all (source.ts). The panel opens from the command palette
// and the View menu ("GPU memory: Open panel"), from the status bar item,
// and from its sidebar icon. Settings (refresh, plot window, the status
// item) are edited in the Settings Editor (schema/plugin.json).

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, ISessionContextDialogs, Notification, SessionContextDialogs } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator, nullTranslator } from '@jupyterlab/translation';
import { LabIcon } from '@jupyterlab/ui-components';
import { Signal } from '@lumino/signaling';

import { endOrphans, keepKernel } from './api';
import { formatBytes, Trans } from './format';
import { Alert, alertChanges, alertText, kernelLabel, WINDOWS } from './model';
import { LogEvent, newOOMs } from './oom';
import { GpuPanel } from './panel';
import { StateSource } from './source';
import { GpuStatusItem } from './statusbar';

import 'uplot/dist/uPlot.min.css';

const PLUGIN_ID = 'jupyterlab-gpumem:plugin';

/** A graphics card with rising memory bars: not JupyterLab's kernel chip. */
export const gpuIcon = new LabIcon({
  name: 'gpumem:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<path fill-rule="evenodd" d="M2 5h20v12H2zm2 2v8h16V7z"/>' +
    '<path d="M6 12.5h2.2V14H6zm3.4-2.5h2.2v4H9.4zm3.4-1.5H15V14h-2.2zm3.4-1.2h2.2V14h-2.2z"/>' +
    '<path d="M5 17h9v2.5H5z"/></g></svg>'
});

export const CommandIDs = {
  open: 'gpumem:open-panel',
  free: 'gpumem:free-cache',
  vars: 'gpumem:show-variables',
  why: 'gpumem:why',
  freeWorkers: 'gpumem:free-workers',
  restart: 'gpumem:restart-kernel',
  openNotebook: 'gpumem:open-notebook'
};

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPU memory by notebook, from gpumem serve.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, ISessionContextDialogs, ICommandPalette, ISettingRegistry, ITranslator],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null,
    dialogs: ISessionContextDialogs | null,
    palette: ICommandPalette | null,
    settingRegistry: ISettingRegistry | null,
    translator: ITranslator | null
  ) => {
    const trans: Trans = (translator ?? nullTranslator).load('jupyterlab_gpumem');
    const source = new StateSource();
    const sessionDialogs = dialogs ?? new SessionContextDialogs({ translator: translator ?? nullTranslator });
    const panelOf = (kernelId: string) => tracker.find(w => w.sessionContext.session?.kernel?.id === kernelId);
    const notebookOfKernel = (kernelId: string) => source.state?.notebooks.find(nb => nb.kernel_id === kernelId);
    let settings: ISettingRegistry.ISettings | null = null;

    const panel = new GpuPanel(
      source,
      {
        commands: app.commands,
        setWindow: seconds => void settings?.set('windowMinutes', Math.round(seconds / 60))
      },
      trans
    );
    panel.title.icon = gpuIcon;
    panel.title.label = trans.__('GPU');
    app.shell.add(panel, 'right', { rank: 900 });

    app.commands.addCommand(CommandIDs.open, {
      label: trans.__('GPU memory: Open panel'),
      caption: trans.__('Show GPU memory by notebook (gpumem)'),
      icon: gpuIcon,
      execute: () => app.shell.activateById(panel.id)
    });
    palette?.addItem({ command: CommandIDs.open, category: trans.__('GPU memory') });
    const kernelArg = (args: { kernelId?: unknown }) => String(args.kernelId ?? '');
    app.commands.addCommand(CommandIDs.free, {
      label: trans.__('Free cache'),
      caption: trans.__("gc and empty the frameworks' caches in this kernel, after its current cell; no variable is deleted"),
      execute: args => panel.freeCache(kernelArg(args))
    });
    app.commands.addCommand(CommandIDs.vars, {
      label: trans.__('Show variables'),
      caption: trans.__('The variables holding GPU memory (%gpumem vars), read without running anything in the notebook'),
      execute: args => panel.showVariables(kernelArg(args))
    });
    app.commands.addCommand(CommandIDs.why, {
      label: trans.__('Why?'),
      caption: trans.__("Every byte of this kernel's GPU memory in one row, with who holds it and the fix (%gpumem why)"),
      execute: args => panel.showWhy(kernelArg(args))
    });
    app.commands.addCommand(CommandIDs.freeWorkers, {
      label: trans.__('Free workers'),
      caption: trans.__("End this kernel's worker processes that hold GPU memory (never the kernel itself)"),
      execute: args => panel.freeWorkers(kernelArg(args))
    });
    app.commands.addCommand(CommandIDs.restart, {
      // Disabled, it says why in its label (a greyed item with no reason reads as broken).
      label: args =>
        panelOf(kernelArg(args)) ? trans.__('Restart kernel…') : trans.__('Restart kernel… (open its notebook in this window first)'),
      caption: args =>
        panelOf(kernelArg(args))
          ? trans.__('Restart the kernel (JupyterLab asks first)')
          : trans.__("This notebook's tab is not open in this window: open it (Open notebook) to restart its kernel"),
      isEnabled: args => panelOf(kernelArg(args)) !== undefined,
      execute: async args => {
        const w = panelOf(kernelArg(args));
        return w ? sessionDialogs.restart(w.sessionContext) : false;
      }
    });
    app.commands.addCommand(CommandIDs.openNotebook, {
      label: trans.__('Open notebook'),
      isEnabled: args => Boolean(notebookOfKernel(kernelArg(args))?.path),
      execute: args => {
        const path = notebookOfKernel(kernelArg(args))?.path;
        return path ? app.commands.execute('docmanager:open', { path }) : undefined;
      }
    });

    let showStatus = true;
    const statusChanged = new Signal<GpuPanel, void>(panel);
    if (statusBar) {
      statusBar.registerStatusItem('jupyterlab-gpumem:status', {
        item: new GpuStatusItem(source, tracker, app.shell, () => void app.commands.execute(CommandIDs.open), trans),
        align: 'left',
        rank: 5,
        isActive: () => showStatus,
        activeStateChanged: statusChanged
      });
    }

    if (settingRegistry) {
      const apply = (s: ISettingRegistry.ISettings) => {
        source.refreshSeconds = Number(s.get('refreshSeconds').composite) || 1;
        const minutes = Number(s.get('windowMinutes').composite) || 15;
        panel.windowSeconds = WINDOWS.includes(minutes * 60) ? minutes * 60 : 15 * 60;
        const show = s.get('showStatusItem').composite !== false;
        if (show !== showStatus) {
          showStatus = show;
          statusChanged.emit();
        }
      };
      settingRegistry
        .load(PLUGIN_ID)
        .then(s => {
          settings = s;
          apply(s);
          s.changed.connect(apply);
        })
        .catch(() => {
          // Defaults stand; the Settings Editor says what is wrong with the file.
        });
    }

    // The daemon's alerts (its sentences): each shown once by id. A GPU's
    // alert, when its GPU drops back under the threshold, is updated to the
    // daemon's sentence saying so and then closes; a cull warning that no
    // longer stands (a cell ran) closes.
    const shown = new Map<string, Alert>();
    const toasts = new Map<string, string>();
    source.changed.connect(() => {
      const state = source.state;
      if (!state) {
        return;
      }
      const { fresh, changed, gone } = alertChanges(state.alerts, shown);
      const actionsOf = (a: Alert): Notification.IAction[] => {
        if (a.kind === 'threshold' && a.kernels.length) {
          return [
            {
              label: trans.__('Free cache in my notebooks'),
              caption: trans.__("gc and empty the frameworks' caches in this server's notebooks on that GPU"),
              // One notification for them all: what each returned, as the daemon judged it after the free.
              callback: () => void panel.freeCacheMany(a.kernels)
            }
          ];
        }
        if (a.kind === 'cull' && a.kernels.length === 1) {
          return [
            {
              label: trans.__('Keep it'),
              caption: trans.__('Count this notebook as used now: it is warned again only once it has been idle as long again'),
              callback: () => {
                // The daemon's sentence either way: what it kept, or why not.
                void keepKernel(a.kernels[0])
                  .then(r => {
                    const text = (r.keep as { text?: string } | undefined)?.text;
                    if (r.status === 'ok' && text) {
                      Notification.success(text, { autoClose: 8000 });
                    } else {
                      Notification.error(r.message ?? '', { autoClose: 15000 });
                    }
                  })
                  .catch((e: Error) => Notification.error(e.message, { autoClose: 15000 }))
                  .then(() => source.refresh());
              }
            }
          ];
        }
        return [];
      };
      for (const a of fresh) {
        toasts.set(a.id, Notification.warning(alertText(a), { autoClose: false, actions: actionsOf(a) }));
      }
      // A toast still open says the daemon's current sentence; one the
      // user closed stays closed.
      for (const a of changed) {
        const id = toasts.get(a.id);
        if (id !== undefined) {
          Notification.update({ id, message: alertText(a), type: 'warning', autoClose: false, actions: actionsOf(a) });
        }
      }
      for (const a of gone) {
        const id = toasts.get(a.id);
        toasts.delete(a.id);
        if (id === undefined) {
          continue;
        }
        if (a.kind !== 'threshold') {
          Notification.dismiss(id);
          continue;
        }
        const g = state.gpus.find(x => x.index === a.gpu);
        // A GPU the report no longer lists has no sentence of the daemon's:
        // this one is the extension's.
        const message = g ? g.under_threshold : trans.__('GPU %1 is no longer listed.', a.gpu);
        if (!message || !Notification.update({ id, message, type: 'success', autoClose: 5000, actions: [] })) {
          Notification.dismiss(id);
        }
      }
    });
    // Orphans the daemon ended after a restart or shutdown, and jobs it
    // left running because they compute on a GPU (its sentence, and an
    // action that ends one).
    source.events.connect((_, events) => {
      for (const ev of events) {
        if (ev.kind === 'reclaim' && ev.message) {
          Notification.info(ev.message, { autoClose: 15000 });
        } else if (ev.kind === 'left_running' && ev.message && ev.pid) {
          const pid = ev.pid;
          Notification.warning(ev.message, {
            autoClose: false,
            actions: [
              {
                label: trans.__('End it'),
                caption: trans.__('End pid %1 (SIGTERM, then SIGKILL): its work is lost', pid),
                callback: () => {
                  void endOrphans(ev.kernel_id, [pid])
                    .then(r => {
                      const p = (r.end as { processes?: { ended: boolean; reason?: string; bytes?: number }[] } | undefined)
                        ?.processes?.[0];
                      if (r.status !== 'ok' || !p?.ended) {
                        Notification.warning(trans.__('pid %1 was not ended: %2', pid, p?.reason ?? r.message ?? trans.__('failed')), {
                          autoClose: 8000
                        });
                        return;
                      }
                      // What it did, with the figures of the sample after the process exited.
                      return panel.saySince(Date.now() / 1000, ev.kernel_id, now =>
                        trans.__(
                          'Ended pid %1 of %2 (it held %3); %4',
                          pid,
                          kernelLabel(source.state, ev.kernel_id, ev.notebook, trans),
                          formatBytes(p.bytes ?? 0),
                          now
                        )
                      );
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
          actions: [
            {
              label: trans.__('Open report'),
              caption: trans.__('Show the report in the GPU memory panel'),
              callback: () => {
                openPanel();
                panel.showOOM(ev);
              }
            }
          ]
        });
      }
      for (const ev of events as LogEvent[]) {
        if (ev.kind === 'snapshot') {
          const name = kernelLabel(source.state, ev.kernel_id, ev.notebook, trans);
          Notification.info(trans.__('Memory snapshot of %1 is ready', name), {
            autoClose: 15000,
            actions: [
              {
                label: trans.__('Open'),
                callback: () => {
                  openPanel();
                  void panel.showSnapshot(ev.kernel_id, ev.reason, ev.notebook);
                }
              }
            ]
          });
        }
      }
    });
  }
};

export default plugin;

// The panel's notebook rows (its name cut with an ellipsis, the full path
// on hover, its figure, sparklines of its memory and its GPU work, and an
// actions menu) and the other users' totals.

import { JupyterFrontEnd } from '@jupyterlab/application';
import { Menu } from '@lumino/widgets';

import { el } from './dom';
import { formatBytes, formatUtil, Trans } from './format';
import { LeftRunning, Notebook, plotRange, sparkPath, State } from './model';
import { Palette } from './panel_plots';
import { StateSource } from './source';

/** The commands of a notebook's actions menu (registered by the plugin). */
export const NOTEBOOK_COMMANDS = [
  'gpumem:free-cache',
  'gpumem:show-variables',
  'gpumem:why',
  'gpumem:free-workers',
  'gpumem:restart-kernel',
  'gpumem:open-notebook'
];

const SVG = 'http://www.w3.org/2000/svg';

/** A sparkline with its label before it ("memory", "SM"): two lines of one colour read apart. */
function sparkBox(label: string, spark: SVGSVGElement, cls: string): HTMLSpanElement {
  const box = el('span', `jp-gpumem-spark-box ${cls}`);
  box.append(el('span', 'jp-gpumem-spark-label', label), spark);
  return box;
}

/** This server's notebooks, one row each, in node. */
export class NotebookRows {
  readonly node = el('section', 'jp-gpumem-notebooks');

  constructor(
    private _source: StateSource,
    private _palette: Palette,
    private _commands: JupyterFrontEnd['commands'],
    private _trans: Trans
  ) {}

  /** One row per notebook of this server, biggest first. */
  render(state: State, windowSeconds: number): void {
    const trans = this._trans;
    const box = this.node;
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
    const hist = this._source.historyFor(windowSeconds);
    const [from, to] = plotRange(hist.first(), hist.last || hist.now, windowSeconds);
    const max = Math.max(1, ...rows.map(nb => Math.max(nb.peak_bytes ?? 0, nb.gpu_memory_bytes)));
    for (const nb of rows) {
      const row = this._notebookRow(nb, this._source.reclaimed.get(nb.kernel_id) ?? 0, hist.notebooks.get(nb.kernel_id), from, to, max);
      this._workLine(row, nb, hist.sm.get(nb.kernel_id), from, to, hist.step);
      if (!state.gpus.length) {
        // No GPU figures at all (no driver): no notebook holds "0 B".
        const fig = row.querySelector<HTMLElement>('[data-field=now]')!;
        fig.textContent = trans.__('n/a');
        fig.title = trans.__('GPU n/a: %1', state.warnings.join('; ') || trans.__('gpumem serve sees no GPU.'));
        for (const extra of Array.from(row.querySelectorAll('.jp-gpumem-details, .jp-gpumem-spark-box, .jp-gpumem-work'))) {
          extra.remove();
        }
      }
      this._leftRunning(row, state.left_running ?? [], nb.kernel_id);
      list.appendChild(row);
    }
    box.appendChild(list);
  }

  /**
   * The jobs gpumem serve left running for the notebook's kernel (they
   * outlived a restart, and compute): in its row, marked, in the daemon's
   * sentence, never among everyone else.
   */
  private _leftRunning(row: HTMLLIElement, left: LeftRunning[], kernelId: string): void {
    const mine = left.filter(l => l.kernel_id === kernelId);
    if (!mine.length) {
      return;
    }
    const box = el('div', 'jp-gpumem-left');
    for (const l of mine) {
      const line = el('div', 'jp-gpumem-left-line');
      line.dataset.gpumem = 'left-running';
      line.dataset.pid = String(l.pid);
      line.append(el('span', 'jp-gpumem-left-mark', this._trans.__('left running')), el('span', '', ` ${l.message}`));
      box.appendChild(line);
    }
    row.appendChild(box);
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
    swatch.style.background = this._palette.color(nb.kernel_id);
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
    path.setAttribute('stroke', this._palette.color(nb.kernel_id));
    spark.appendChild(path);
    const memSpark = sparkBox(trans.__('memory'), spark, 'jp-gpumem-spark-mem');
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
    row.append(swatch, name, now, more, memSpark, details);
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
    spark.classList.add('jp-gpumem-spark', 'jp-gpumem-spark-dashed');
    spark.setAttribute('viewBox', '0 0 100 14');
    spark.setAttribute('preserveAspectRatio', 'none');
    spark.setAttribute('aria-hidden', 'true');
    const title = document.createElementNS(SVG, 'title');
    title.textContent = trans.__("%1's SM utilization over the plot's window", nb.display_name);
    spark.appendChild(title);
    const path = document.createElementNS(SVG, 'path');
    const top = Math.max(100, ...(points ? [...points.values()] : []));
    path.setAttribute('d', sparkPath(points, from, to, 100, 14, top, Math.max(1, step)));
    path.setAttribute('stroke', this._palette.color(nb.kernel_id));
    spark.appendChild(path);
    row.append(work, sparkBox(trans.__('SM'), spark, 'jp-gpumem-spark-sm'));
  }

  /** A notebook's actions menu: JupyterLab's commands, with their labels and captions. */
  private _menu(kernelId: string): Menu {
    const menu = new Menu({ commands: this._commands });
    menu.addClass('jp-gpumem-menu');
    for (const command of NOTEBOOK_COMMANDS) {
      menu.addItem({ command, args: { kernelId } });
    }
    menu.aboutToClose.connect(() => setTimeout(() => menu.dispose(), 0));
    return menu;
  }
}

/** Everyone else, as the daemon totals them per user, in node. */
export class OtherUsers {
  readonly node = el('section', 'jp-gpumem-others');

  constructor(private _trans: Trans) {}

  /** Other users, each as the daemon totals them. */
  render(state: State): void {
    const trans = this._trans;
    const box = this.node;
    box.replaceChildren();
    if (!state.others.length) {
      return;
    }
    box.appendChild(el('h3', '', trans.__('Everyone else')));
    const list = el('ul', 'jp-gpumem-rows');
    for (const u of state.others) {
      const row = el('li', 'jp-gpumem-row jp-gpumem-user');
      // A user the daemon could not name (a process gone from /proc before its owner was read).
      const name = el('span', 'jp-gpumem-name', u.user || trans.__('unknown user'));
      const what = [
        trans._n('%1 notebook', '%1 notebooks', u.notebooks),
        trans._n('%1 other process', '%1 other processes', u.other_processes)
      ].join(', ');
      name.title = u.user
        ? trans.__('user %1: %2', u.user, what)
        : trans.__('processes whose owner gpumem serve could not read (gone from /proc): %1', what);
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

// The panel's views of one notebook or one event (Why?, Show variables, an
// out-of-memory report): a head with its title, "as of" the time its
// figures were read, a refresh and a close button; and the list they show,
// a row per holder that reflows at 250 px: its name first (wrapped, never
// cut), its bytes at the right, what it is under them, and the fix on a
// line of its own. Text only: nothing a kernel sends becomes markup.

import { el } from './dom';
import { clockTime, Trans } from './format';

/** One row of a view's list. */
export interface ListRow {
  name: string;
  bytes: string;
  /** What it is ("variable · cuda:0"), under the name. */
  sub?: string;
  /** What holds it, or a note. */
  detail?: string;
  /** How to free it: a line of its own. */
  fix?: string;
  /** The name's class (e.g. italic for what only IPython holds). */
  nameCls?: string;
}

/** A view's list, named name (its data-gpumem). */
export function listNode(name: string, rows: ListRow[]): HTMLUListElement {
  const list = el('ul', 'jp-gpumem-list');
  list.dataset.gpumem = name;
  for (const r of rows) {
    const li = el('li', 'jp-gpumem-list-row');
    li.append(el('span', `jp-gpumem-list-name ${r.nameCls ?? ''}`.trim(), r.name), el('span', 'jp-gpumem-num', r.bytes));
    for (const [cls, text] of [
      ['jp-gpumem-list-sub', r.sub],
      ['jp-gpumem-list-sub', r.detail],
      ['jp-gpumem-list-fix', r.fix]
    ] as const) {
      if (text) {
        li.appendChild(el('div', cls, text));
      }
    }
    list.appendChild(li);
  }
  return list;
}

/** What a view's head does. */
export interface ViewHead {
  node: HTMLDivElement;
  /** Says when the figures shown were read (unix seconds). */
  asOf(unixSeconds: number, what?: string): void;
}

/**
 * A view's head: its title, the time of its figures, and a refresh button
 * (when refresh is given) and a close button.
 */
export function viewHead(title: string, trans: Trans, close: () => void, refresh?: () => void): ViewHead {
  const node = el('div', 'jp-gpumem-report-title');
  const text = el('div', 'jp-gpumem-view-title');
  const time = el('div', 'jp-gpumem-asof');
  time.dataset.gpumem = 'as-of';
  text.append(el('h3', '', title), time);
  node.appendChild(text);
  const buttons = el('div', 'jp-gpumem-view-buttons');
  if (refresh) {
    const b = el('button', 'jp-gpumem-more jp-Button jp-mod-minimal', '↻');
    b.dataset.gpumem = 'view-refresh';
    b.setAttribute('aria-label', trans.__('Read again: %1', title));
    b.title = trans.__('Read again');
    b.onclick = refresh;
    buttons.appendChild(b);
  }
  const c = el('button', 'jp-gpumem-more jp-Button jp-mod-minimal', '✕');
  c.dataset.gpumem = 'view-close';
  c.setAttribute('aria-label', trans.__('Close: %1', title));
  c.title = trans.__('Close');
  c.onclick = close;
  buttons.appendChild(c);
  node.appendChild(buttons);
  return {
    node,
    asOf: (t, what) => {
      time.textContent = what ? trans.__('%1 at %2', what, clockTime(t)) : trans.__('as of %1', clockTime(t));
    }
  };
}

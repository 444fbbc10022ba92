// Building the extension's DOM (the panel's and the out-of-memory
// report's): text only, so that nothing a kernel sends or a notebook is
// named becomes markup.

/** A new `tag` element with class `cls` and text `text` (each when given). */
export function el<K extends keyof HTMLElementTagNameMap>(tag: K, cls = '', text = ''): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  if (cls) {
    e.className = cls;
  }
  if (text) {
    e.textContent = text;
  }
  return e;
}

/**
 * A table of class `cls`, named `name` (its data-gpumem), whose first row
 * heads its columns with `heads` (each a th of class `headCls`).
 */
export function headedTable(cls: string, name: string, heads: string[], headCls = ''): HTMLTableElement {
  const table = el('table', cls);
  table.dataset.gpumem = name;
  const head = el('tr');
  for (const h of heads) {
    head.appendChild(el('th', headCls, h));
  }
  table.appendChild(head);
  return table;
}

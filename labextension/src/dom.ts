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

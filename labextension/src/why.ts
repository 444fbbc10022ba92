// Why? in the panel: the rows of %gpumem why (the kernel's and the ones
// gpumem serve joined from the driver's figures) as the view's list, and
// the lines the kernel rendered under them. A worker's row is dropped once
// the daemon's samples no longer list its pid for the notebook: Why? must
// not show a worker that has ended. Pure: unit-tested in why.test.ts.

import { formatBytes, plainTrans, Trans } from './format';
import type { Notebook } from './model';
import type { ListRow } from './view';

/** A row of %gpumem why, as the kernel and the daemon write it. */
export interface WhyRow {
  category?: string;
  name?: string;
  device?: string;
  bytes?: number;
  fix?: string;
  note?: string;
  holder?: string;
  chain?: string[];
  pid?: number;
}

/** The why data the daemon returns, rendered by the kernel (its text). */
export interface WhyData {
  rows?: WhyRow[];
  text?: string;
}

/** What each category of row is, in the words %gpumem why uses. */
function categoryLabel(category: string | undefined, trans: Trans): string {
  const labels: Record<string, string> = {
    variables: trans.__('variable'),
    hidden: trans.__('IPython'),
    elsewhere: trans.__('held elsewhere'),
    c_level: trans.__('no Python holder'),
    cache: trans.__('cache'),
    untraceable: trans.__('untraceable'),
    outside: trans.__('outside the allocator'),
    child: trans.__('child process'),
    unexplained: trans.__('unexplained')
  };
  return labels[category ?? ''] ?? category ?? '';
}

/**
 * The view's rows of why, and the pids of the worker rows dropped because
 * nb (the notebook as the last sample has it) no longer lists them.
 */
export function whyRows(why: WhyData, nb: Notebook | undefined, trans: Trans = plainTrans): { rows: ListRow[]; ended: number[] } {
  const live = nb ? new Set([...nb.pids, ...nb.processes.map(p => p.pid)]) : null;
  const rows: ListRow[] = [];
  const ended: number[] = [];
  for (const r of why.rows ?? []) {
    if (r.category === 'child' && r.pid && live && !live.has(r.pid)) {
      ended.push(r.pid);
      continue;
    }
    const chain = r.chain ?? [];
    const detail =
      r.category === 'elsewhere' && chain.length > 1 ? trans.__('held by %1: %2', r.holder ?? '?', chain.join(' → ')) : (r.note ?? '');
    rows.push({
      name: r.name || categoryLabel(r.category, trans),
      bytes: formatBytes(r.bytes ?? 0),
      sub: [categoryLabel(r.category, trans), r.device && r.device !== '-' ? r.device : ''].filter(Boolean).join(' · '),
      detail,
      fix: r.fix ? trans.__('fix: %1', r.fix) : '',
      nameCls: r.category === 'hidden' ? 'jp-gpumem-hidden' : ''
    });
  }
  return { rows, ended };
}

/**
 * The lines the kernel rendered under its rows (the driver's figure, the
 * flags, the advice): its text's last block, after the title and the table.
 */
export function whyFoot(text: string): string[] {
  const blocks = text.split('\n\n');
  if (blocks.length < 3) {
    return [];
  }
  return blocks
    .slice(2)
    .join('\n')
    .split('\n')
    .map(l => l.trim())
    .filter(Boolean);
}

/**
 * Server-drawn SVG bar charts for the Overview: one bar per day, stacked by series, with a title
 * and a summary for screen readers (role="img"), a <title> per day for a pointer, and each
 * bar's day (its group's), series and count in data attributes. No script and no external resource (the pages' CSP
 * is default-src 'self'). Every string that reaches the markup is escaped here.
 */

export interface ChartSeries {
  key: string;
  label: string;
  /** The bars' fill (an attribute: the pages' CSP allows no inline style). */
  color: string;
}

export interface ChartInput {
  id: string;
  title: string;
  /** What one unit is, for the summary: "sign-ins". */
  unit: string;
  series: readonly ChartSeries[];
  /** One entry per day, oldest first. */
  days: readonly { day: string; counts: Readonly<Record<string, number>> }[];
}

const escape = (s: string): string => s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

const W = 600;
const H = 170;
const LEFT = 44;
const BOTTOM = 24;
const TOP = 16;

/** The axis maximum: the largest day's total rounded up to 1, 2 or 5 × a power of ten, at least 2. */
export function niceMax(n: number): number {
  if (n <= 2) return 2;
  const power = 10 ** Math.floor(Math.log10(n));
  for (const step of [1, 2, 5, 10]) if (n <= step * power) return step * power;
  return 10 * power;
}

/** Short day label: "27 Nov". */
const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
const shortDay = (day: string) => `${Number(day.slice(8, 10))} ${MONTHS[Number(day.slice(5, 7)) - 1]}`;

export function barChart(input: ChartInput): string {
  const totals = input.days.map((d) => input.series.reduce((sum, s) => sum + (d.counts[s.key] ?? 0), 0));
  const max = niceMax(Math.max(0, ...totals));
  const plotW = W - LEFT;
  const plotH = H - TOP - BOTTOM;
  const slot = plotW / Math.max(1, input.days.length);
  const barW = Math.max(1, slot * 0.7);
  const sum = totals.reduce((a, b) => a + b, 0);
  const first = input.days[0]?.day ?? '';
  const last = input.days.at(-1)?.day ?? '';
  const busiest = totals.indexOf(Math.max(...totals));
  const summary =
    sum === 0
      ? `No ${input.unit} from ${first} to ${last}.`
      : `${sum} ${input.unit} from ${first} to ${last}; the most on ${input.days[busiest]!.day} (${totals[busiest]}); ${totals.at(-1)} today.`;
  const parts: string[] = [];
  parts.push(
    `<svg class="chart" id="${escape(input.id)}" viewBox="0 0 ${W} ${H}" role="img" aria-labelledby="${escape(input.id)}-title ${escape(input.id)}-desc" data-max="${max}">`,
    `<title id="${escape(input.id)}-title">${escape(input.title)}</title>`,
    `<desc id="${escape(input.id)}-desc">${escape(summary)}</desc>`,
  );
  // Grid: zero, half and the maximum, labelled.
  for (const fraction of Number.isInteger(max / 2) ? [0, 0.5, 1] : [0, 1]) {
    const y = TOP + plotH - fraction * plotH;
    const value = max * fraction;
    parts.push(
      `<line class="grid" x1="${LEFT}" x2="${W}" y1="${y.toFixed(1)}" y2="${y.toFixed(1)}"/>`,
      `<text class="axis" x="${LEFT - 4}" y="${(y + 5).toFixed(1)}" text-anchor="end">${value}</text>`,
    );
  }
  // One group per day with a count: its title (a pointer's tooltip) says every series of it.
  input.days.forEach((d, i) => {
    if (totals[i] === 0) return;
    const x = (LEFT + i * slot + (slot - barW) / 2).toFixed(1);
    const w = barW.toFixed(1);
    let y = TOP + plotH;
    const said = input.series.filter((s) => (d.counts[s.key] ?? 0) > 0).map((s) => `${d.counts[s.key]} ${s.label}`);
    parts.push(`<g data-day="${escape(d.day)}"><title>${escape(`${d.day}: ${said.join(', ')}`)}</title>`);
    for (const s of input.series) {
      const count = d.counts[s.key] ?? 0;
      if (count === 0) continue;
      const h = (count / max) * plotH;
      y -= h;
      parts.push(`<rect x="${x}" y="${y.toFixed(1)}" width="${w}" height="${h.toFixed(1)}" fill="${escape(s.color)}" data-series="${escape(s.key)}" data-count="${count}"/>`);
    }
    parts.push('</g>');
  });
  if (first) {
    parts.push(
      `<text class="axis" x="${LEFT}" y="${H - 4}">${escape(shortDay(first))}</text>`,
      `<text class="axis" x="${W}" y="${H - 4}" text-anchor="end">${escape(shortDay(last))}</text>`,
    );
  }
  parts.push('</svg>');
  return parts.join('');
}

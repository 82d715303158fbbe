import { describe, expect, it } from 'vitest';
import { barChart, niceMax } from '../../src/web/charts.js';

describe('the Overview charts (server-drawn SVG)', () => {
  it('rounds the axis up to 1, 2 or 5 × a power of ten, at least 2', () => {
    expect([0, 1, 2, 3, 5, 6, 10, 11, 99, 101, 4999, 5001].map(niceMax)).toEqual([2, 2, 2, 5, 5, 10, 10, 20, 100, 200, 5000, 10000]);
  });

  it('stacks each day’s series in a bar of its share of the axis, and escapes every label', () => {
    const svg = barChart({
      id: 'c1',
      title: 'A <b>"title"</b>',
      unit: 'things',
      series: [{ key: 'a', label: 'a & b', color: '#000' }, { key: 'b', label: 'b', color: '#111' }],
      days: [{ day: '2026-11-26', counts: { a: 3, b: 1 } }, { day: '2026-11-27', counts: { a: 0, b: 10 } }],
    });
    expect(svg).toContain('data-max="10"');
    expect(svg).toContain('<title id="c1-title">A &#60;b&#62;&#34;title&#34;&#60;/b&#62;</title>');
    expect(svg).toContain('<desc id="c1-desc">14 things from 2026-11-26 to 2026-11-27; the most on 2026-11-27 (10); 10 today.</desc>');
    expect(svg).not.toMatch(/<b>|& b/);
    const rects = [...svg.matchAll(/<g data-day="([\d-]+)">(.*?)<\/g>/g)].flatMap((g) =>
      [...g[2]!.matchAll(/<rect [^>]*height="([\d.]+)"[^>]*data-series="(\w+)" data-count="(\d+)"\/>/g)].map((m) => ({ h: Number(m[1]), day: g[1], series: m[2], n: Number(m[3]) })),
    );
    expect(svg).toContain('<title>2026-11-26: 3 a &#38; b, 1 b</title>');
    // No bar for a zero; heights in proportion to the counts.
    expect(rects.map((r) => [r.day, r.series, r.n])).toEqual([['2026-11-26', 'a', 3], ['2026-11-26', 'b', 1], ['2026-11-27', 'b', 10]]);
    expect(rects[2]!.h / rects[0]!.h).toBeCloseTo(10 / 3, 1);
    expect(barChart({ id: 'e', title: 'E', unit: 'sign-ins', series: [{ key: 'a', label: 'a', color: '#000' }], days: [{ day: '2026-11-27', counts: {} }] })).toContain('No sign-ins from 2026-11-27 to 2026-11-27.');
  });
});

/**
 * A flame graph (SVG) of a V8 CPU profile, such as `BENCH_CPU_PROF=1 npm run bench` or node's
 * --cpu-prof writes: each frame as wide as the time its stack spent in it, callers below
 * callees, frames narrower than MIN_SHARE left out. "(idle)" stays in, as its own frame: a
 * server that waits is as much a finding as one that works.
 *
 *   npx tsx bench/flamegraph.ts <profile.cpuprofile> <out.svg> [title]
 */
import { readFileSync, writeFileSync } from 'node:fs';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface Profile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
}

interface Frame {
  name: string;
  kind: 'bundle' | 'dependency' | 'node' | 'native';
  time: number;
  children: Map<string, Frame>;
}

const MIN_SHARE = 0.003;
const WIDTH = 1200;
const ROW = 17;

function label(node: ProfileNode): { name: string; kind: Frame['kind'] } {
  const { functionName, url, lineNumber } = node.callFrame;
  const fn = functionName || '(anonymous)';
  if (!url) return { name: fn, kind: 'native' };
  const file = url.replace(/^file:\/\//, '');
  const short = file.split('/').slice(-2).join('/');
  if (file.startsWith('node:') || !file.includes('/')) return { name: `${fn} ${short}`, kind: 'node' };
  // dist/bundle holds orgauth and the dependencies it bundles (Fastify, pg...): the line tells which.
  return { name: `${fn} ${short}:${lineNumber + 1}`, kind: file.includes('node_modules') ? 'dependency' : 'bundle' };
}

function build(profile: Profile): Frame {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const self = new Map<number, number>();
  profile.samples.forEach((id, i) => self.set(id, (self.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0)));
  const root: Frame = { name: 'all', kind: 'native', time: 0, children: new Map() };
  for (const [id, time] of self) {
    const stack: ProfileNode[] = [];
    for (let cur: number | undefined = id; cur !== undefined; cur = parent.get(cur)) stack.unshift(byId.get(cur)!);
    let frame = root;
    root.time += time;
    // The first node is V8's (root): the stack starts below it.
    for (const node of stack.slice(1)) {
      const { name, kind } = label(node);
      let next = frame.children.get(name);
      if (!next) frame.children.set(name, (next = { name, kind, time: 0, children: new Map() }));
      next.time += time;
      frame = next;
    }
  }
  return root;
}

const COLOURS: Record<Frame['kind'], string> = { bundle: '#e8743b', dependency: '#f2b134', node: '#6aa9d8', native: '#b4b4b4' };
const escape = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');

function render(root: Frame, title: string): string {
  // Laid out first (x and level of each frame drawn), then drawn bottom up once the depth is known.
  const laid: { frame: Frame; x: number; level: number; width: number }[] = [];
  const lay = (frame: Frame, x: number, level: number) => {
    laid.push({ frame, x, level, width: (frame.time / root.time) * WIDTH });
    let cx = x;
    for (const child of [...frame.children.values()].sort((a, b) => b.time - a.time)) {
      if (child.time / root.time < MIN_SHARE) continue;
      lay(child, cx, level + 1);
      cx += (child.time / root.time) * WIDTH;
    }
  };
  lay(root, 0, 0);
  const depth = Math.max(...laid.map((l) => l.level));
  const height = (depth + 1) * ROW + 56;
  const body = laid
    .map(({ frame, x, level, width }) => {
      const y = height - 20 - (level + 1) * ROW;
      const text = width > 40 ? `<text x="${(x + 3).toFixed(2)}" y="${y + 12}">${escape(frame.name.slice(0, Math.floor(width / 6.5)))}</text>` : '';
      return `<g><title>${escape(frame.name)}: ${((100 * frame.time) / root.time).toFixed(1)}%</title><rect x="${x.toFixed(2)}" y="${y}" width="${Math.max(0.5, width - 0.5).toFixed(2)}" height="${ROW - 1}" fill="${COLOURS[frame.kind]}"/>${text}</g>`;
    })
    .join('\n');
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${height}" font-family="monospace" font-size="11" role="img" aria-label="${escape(title)}">
<rect width="100%" height="100%" fill="#fff"/>
<text x="4" y="14" font-size="13">${escape(title)}</text>
<text x="4" y="30">${(root.time / 1e6).toFixed(1)} s of samples; orange: the bundle (orgauth and what it bundles), yellow: other dependencies, blue: Node.js, grey: native and V8</text>
${body}
</svg>
`;
}

const [input, output, title] = process.argv.slice(2);
if (!input || !output) {
  console.error('usage: npx tsx bench/flamegraph.ts <profile.cpuprofile> <out.svg> [title]');
  process.exit(2);
}
writeFileSync(output, render(build(JSON.parse(readFileSync(input, 'utf8')) as Profile), title ?? input));

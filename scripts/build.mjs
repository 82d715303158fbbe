// `npm run build`: compiles src/ and migrations/ into dist/ (tsc -p tsconfig.build.json) and
// copies the templates beside them, unless dist/ was built from exactly the files there are now.
// `node scripts/build.mjs bench` does the same for the bench's servers (tsconfig.bench.json) after
// the build. npm ci's prepare, each `npm test`'s pretest and the bench all ask for a build; only the
// first one of a checkout (or after a change) compiles. The inputs' hash, not their times, decides:
// a checkout, a stash or a clock that moved back cannot leave dist/ stale.
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { copyTemplates } from './copy-templates.mjs';

const ROOT = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const DIST = path.join(ROOT, 'dist');

const PROJECTS = {
  build: { tsconfig: 'tsconfig.build.json', inputs: ['src', 'migrations'] },
  bench: { tsconfig: 'tsconfig.bench.json', inputs: ['src', 'migrations', 'bench/server.ts', 'bench/peer-oidc-provider.ts'] },
};
/** What every compile depends on besides its sources: the compiler settings and versions, and this script. */
const SHARED_INPUTS = ['tsconfig.json', 'package-lock.json', 'scripts/build.mjs', 'scripts/copy-templates.mjs'];

/** Every file of the inputs (folders read recursively), relative to the root, sorted. */
function inputFiles(inputs) {
  const found = new Set();
  for (const input of inputs) {
    const full = path.join(ROOT, input);
    if (!existsSync(full)) continue;
    if (!statSync(full).isDirectory()) {
      found.add(input);
      continue;
    }
    for (const entry of readdirSync(full, { withFileTypes: true, recursive: true })) {
      if (entry.isFile()) found.add(path.relative(ROOT, path.join(entry.parentPath, entry.name)));
    }
  }
  return [...found].sort();
}

/** sha256 over every input file's path and content, in a fixed order. */
function inputsHash(project) {
  const hash = createHash('sha256');
  for (const file of inputFiles([...SHARED_INPUTS, project.tsconfig, ...project.inputs])) {
    hash.update(`${file}\0`);
    hash.update(readFileSync(path.join(ROOT, file)));
    hash.update('\0');
  }
  return hash.digest('hex');
}

function compile(name) {
  const project = PROJECTS[name];
  const stamp = path.join(DIST, `.inputs-${name}`);
  const hash = inputsHash(project);
  if (existsSync(stamp) && readFileSync(stamp, 'utf8') === hash) return;
  // A fresh tree for the build (no output of a deleted source left behind); the bench adds to it.
  if (name === 'build') rmSync(DIST, { recursive: true, force: true });
  else rmSync(stamp, { force: true });
  const tsc = spawnSync(process.execPath, [path.join(ROOT, 'node_modules/typescript/bin/tsc'), '-p', project.tsconfig], { cwd: ROOT, stdio: 'inherit' });
  if (tsc.status !== 0) process.exit(tsc.status ?? 1);
  copyTemplates(DIST);
  writeFileSync(stamp, hash);
}

const target = process.argv[2] ?? 'build';
if (!(target in PROJECTS)) {
  console.error(`usage: node scripts/build.mjs [${Object.keys(PROJECTS).join('|')}]`);
  process.exit(2);
}
compile('build');
if (target === 'bench') compile('bench');

// `npm run build`: compiles src/ and migrations/ into dist/ (tsc -p tsconfig.build.json) and
// copies the templates beside them, unless dist/ was built from exactly the files there are now.
// `node scripts/build.mjs bench` then adds the bench's two servers (bench/server.ts,
// bench/peer-oidc-provider.ts) to dist/bench, each transpiled on its own (ts.transpileModule:
// the code base is isolatedModules, and `tsc --noEmit` type-checks bench/ with everything else),
// rather than compiling src/ a second time for them (about 12 s). npm ci's prepare, each `npm
// test`'s pretest and the bench all ask for a build; only the first one of a checkout (or after a
// change) compiles. The inputs' hash, not their times, decides: a checkout, a stash or a clock that moved back cannot leave dist/ stale.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { copyTemplates } from './copy-templates.mjs';

const ROOT = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const DIST = path.join(ROOT, 'dist');

const BENCH_SERVERS = ['bench/server.ts', 'bench/peer-oidc-provider.ts'];
const PROJECTS = {
  build: { tsconfig: 'tsconfig.build.json', inputs: ['src', 'migrations'] },
  // Transpiled with tsconfig.json's options (one of SHARED_INPUTS).
  bench: { inputs: BENCH_SERVERS },
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
  for (const file of inputFiles([...SHARED_INPUTS, ...(project.tsconfig ? [project.tsconfig] : []), ...project.inputs])) {
    hash.update(`${file}\0`);
    hash.update(readFileSync(path.join(ROOT, file)));
    hash.update('\0');
  }
  return hash.digest('hex');
}

async function compile(name) {
  const project = PROJECTS[name];
  const stamp = path.join(DIST, `.inputs-${name}`);
  const hash = inputsHash(project);
  if (existsSync(stamp) && readFileSync(stamp, 'utf8') === hash) return;
  // A fresh tree for the build (no output of a deleted source left behind); the bench adds to it.
  if (name === 'build') rmSync(DIST, { recursive: true, force: true });
  else rmSync(stamp, { force: true });
  if (name === 'bench') {
    await transpileBenchServers();
  } else {
    const tsc = spawnSync(process.execPath, [path.join(ROOT, 'node_modules/typescript/bin/tsc'), '-p', project.tsconfig], { cwd: ROOT, stdio: 'inherit' });
    if (tsc.status !== 0) process.exit(tsc.status ?? 1);
    copyTemplates(DIST);
  }
  writeFileSync(stamp, hash);
}

/**
 * dist/bench/*.js(.map) as tsc would write them, with tsconfig.json's options (ES modules, as
 * package.json's "type" makes them: transpileModule alone cannot tell).
 */
async function transpileBenchServers() {
  const { default: ts } = await import('typescript');
  const config = ts.getParsedCommandLineOfConfigFile(path.join(ROOT, 'tsconfig.json'), {}, { ...ts.sys, onUnRecoverableConfigFileDiagnostic: (d) => { throw new Error(ts.flattenDiagnosticMessageText(d.messageText, '\n')); } });
  for (const file of BENCH_SERVERS) {
    const out = path.join(DIST, file.replace(/\.ts$/, '.js'));
    const { outputText, sourceMapText } = ts.transpileModule(readFileSync(path.join(ROOT, file), 'utf8'), { compilerOptions: { ...config.options, module: ts.ModuleKind.ESNext }, fileName: path.join(ROOT, file), reportDiagnostics: false });
    mkdirSync(path.dirname(out), { recursive: true });
    writeFileSync(out, outputText);
    if (sourceMapText) writeFileSync(`${out}.map`, sourceMapText);
  }
}

const target = process.argv[2] ?? 'build';
if (!(target in PROJECTS)) {
  console.error(`usage: node scripts/build.mjs [${Object.keys(PROJECTS).join('|')}]`);
  process.exit(2);
}
await compile('build');
if (target === 'bench') await compile('bench');

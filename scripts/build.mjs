// `npm run build`: compiles src/ and migrations/ into dist/ (tsc -p tsconfig.build.json), copies
// the templates beside them, then bundles what a process starts from (bundle() below), unless
// dist/ was built from exactly the files there are now.
// `node scripts/build.mjs bench` then adds the bench's servers and load generator (bench/server.ts,
// bench/peer-oidc-provider.ts, bench/load.ts, bench/floor-server.ts) to dist/bench, each
// transpiled on its own (ts.transpileModule: the code base is isolatedModules, and `tsc --noEmit`
// type-checks bench/ with everything else), rather than compiling src/ a second time for them
// (about 12 s); the first is then bundled as the server is. npm ci's prepare, each `npm
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

const BENCH_SERVERS = ['bench/server.ts', 'bench/peer-oidc-provider.ts', 'bench/load.ts', 'bench/floor-server.ts'];
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
    // The bench's server starts as the real one does: bundled (its chunks in dist/bench).
    await bundle({ 'bench/server': 'dist/bench/server.js' }, 'bench');
  } else {
    const tsc = spawnSync(process.execPath, [path.join(ROOT, 'node_modules/typescript/bin/tsc'), '-p', project.tsconfig], { cwd: ROOT, stdio: 'inherit' });
    if (tsc.status !== 0) process.exit(tsc.status ?? 1);
    copyTemplates(DIST);
    await bundle(PROCESS_ENTRIES(), 'bundle');
  }
  writeFileSync(stamp, hash);
}

/**
 * What a process starts from, each bundled (esbuild) from tsc's output into one file of dist/ with
 * the packages it uses: the server, the command line and each migration (which the server
 * imports by file name at start). Node 20 loads ES modules one file at a time, and kysely, zod
 * and jose alone are some 400 files: the command line took ~1.0 s to import as tsc wrote it and
 * ~0.35 s bundled. The migrations share the server's kysely (in a chunk) instead of loading a
 * second one.
 */
const PROCESS_ENTRIES = () => ({
  'bundle/server': 'dist/src/server.js',
  'bundle/cli': 'dist/src/cli/index.js',
  ...Object.fromEntries(
    readdirSync(path.join(DIST, 'migrations'))
      .filter((f) => f.endsWith('.js'))
      .map((f) => [`migrations/${f.replace(/\.js$/, '')}`, `dist/migrations/${f}`]),
  ),
});
/**
 * Loaded from node_modules at run time, not bundled: native code (argon2), files found beside the
 * package's own module (PGlite's WebAssembly, pino's worker threads) and optional ones. So is
 * every package src/ loads lazily with import() (nodemailer, ioredis, node-saml, …: not on the
 * way to ready, and Node, not the bundler, then decides what a CommonJS package exports).
 */
const NOT_BUNDLED = ['argon2', '@electric-sql/pglite', '@electric-sql/pglite/*', 'pino', 'pino-pretty', 'thread-stream', 'pg-native'];

/**
 * Bundles `entries` ({ output name under dist/: input file }) with code splitting (the shared
 * chunks in dist/<chunkFolder>), replacing the inputs where the names are the same. Every output file is one folder below dist/, so the
 * `import.meta.url` of a module (from which src/ finds its templates, assets and migrations/)
 * can be kept as it was: it becomes `new URL('../<its path under dist>', import.meta.url)`,
 * whichever output file the module lands in.
 */
async function bundle(entries, chunkFolder) {
  const { build, transformSync } = await import('esbuild');
  const lazyPackagesAsIs = {
    name: 'lazy-packages-as-is',
    setup(b) {
      b.onResolve({ filter: /^[^./]/ }, (args) => (args.kind === 'dynamic-import' ? { path: args.path, external: true } : undefined));
    },
  };
  const keepOwnUrl = {
    name: 'keep-import-meta-url',
    setup(b) {
      b.onLoad({ filter: /\.js$/ }, (args) => {
        const relative = path.relative(DIST, args.path);
        if (relative.startsWith('..')) return undefined;
        const contents = readFileSync(args.path, 'utf8').replaceAll('import.meta.url', `new URL(${JSON.stringify(`../${relative.split(path.sep).join('/')}`)}, import.meta.url).href`);
        return { contents, loader: 'js', resolveDir: path.dirname(args.path) };
      });
    },
  };
  const result = await build({
    absWorkingDir: ROOT,
    entryPoints: entries,
    outdir: DIST,
    chunkNames: `${chunkFolder}/chunk-[hash]`,
    bundle: true,
    splitting: true,
    format: 'esm',
    platform: 'node',
    target: 'node20',
    external: NOT_BUNDLED,
    // The CommonJS packages bundled in (fastify, pg, …) require Node's own modules.
    banner: { js: "import { createRequire as __orgauthCreateRequire } from 'node:module'; const require = __orgauthCreateRequire(import.meta.url);" },
    sourcemap: 'linked',
    plugins: [lazyPackagesAsIs, keepOwnUrl],
    write: false,
    logLevel: 'warning',
  });
  for (const file of result.outputFiles) {
    if (path.relative(DIST, path.dirname(file.path)).split(path.sep).length !== 1) throw new Error(`bundle: ${file.path} is not one folder below dist/`);
  }
  for (const file of result.outputFiles) {
    mkdirSync(path.dirname(file.path), { recursive: true });
    writeFileSync(file.path, file.path.endsWith('.js') ? asciiComments(file.text, transformSync, file.path) : file.contents);
  }
}

/**
 * The bundle's text with every character outside ASCII in its comments replaced by '?'. esbuild
 * writes strings, identifiers and regular expressions in ASCII (its default charset) but keeps
 * some of the bundled packages' comments as they are, and a single '—' in one of them made V8
 * hold that file's whole source (2.5 MB, kept for lazy compilation) as a two-byte string: 10 MB
 * of the server's live heap for its two large files instead of 5. One '?' per UTF-16 unit keeps
 * every column, so the source maps stay exact. A template literal's text cannot be escaped (a
 * tag sees it raw), so the replacement is kept only when the code without its comments is the
 * same before and after; otherwise the file is written as it is and the place is named.
 */
function asciiComments(text, transformSync, file) {
  const ascii = text.replace(/[^\x00-\x7f]/g, '?');
  if (ascii === text) return text;
  const code = (source) => transformSync(source, { minifyWhitespace: true, legalComments: 'none', format: 'esm' }).code;
  const before = code(text);
  const after = code(ascii);
  if (before === after) return ascii;
  let at = 0;
  while (before[at] === after[at]) at++;
  console.warn(`build: ${path.relative(ROOT, file)} keeps a character outside ASCII in its code, not a comment (V8 holds the file in two bytes a character): ${JSON.stringify(before.slice(Math.max(0, at - 60), at + 20))}`);
  return text;
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

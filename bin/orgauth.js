#!/usr/bin/env node
// The `orgauth` command. The TypeScript is compiled to dist/ by `npm install` (prepare) and `npm start`.
let runCli;
try {
  ({ runCli } = await import('../dist/bundle/cli.js'));
} catch (err) {
  if (err?.code !== 'ERR_MODULE_NOT_FOUND' || !String(err.message).includes('dist/bundle/cli.js')) throw err;
  process.stderr.write('orgauth: not built yet; run `npm run build` (npm install does it) and try again\n');
  process.exit(1);
}
process.exitCode = await runCli(process.argv.slice(2), {
  stdout: (text) => process.stdout.write(text),
  stderr: (text) => process.stderr.write(text),
  env: process.env,
  // Long commands show their progress on stderr when it is a terminal (never with --json).
  terminal: process.stderr.isTTY ? { columns: () => process.stderr.columns } : undefined,
});

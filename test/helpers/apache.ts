/**
 * A disposable Apache httpd (Debian's `apache2` and `libapache2-mod-oauth2`) for the tests of
 * gateways in front of our users' services (issue 44). It runs in the foreground as a child of
 * the test, on a free port of 127.0.0.1, from a generated httpd.conf in a temporary folder that
 * loads only the modules it needs by path (not the package's site configuration, and not the
 * system service, which is left alone). As root, its children switch to www-data, as Apache
 * requires.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { freePort } from './process.js';

const APACHE = '/usr/sbin/apache2';
const MODULES = '/usr/lib/apache2/modules';
const NEEDED = ['mod_mpm_event.so', 'mod_authn_core.so', 'mod_authz_core.so', 'mod_authz_user.so', 'mod_proxy.so', 'mod_proxy_http.so', 'mod_oauth2.so'];

/** Why Apache with mod_oauth2 cannot run here, or undefined when it can. */
export function apacheMissing(): string | undefined {
  if (!existsSync(APACHE)) return `${APACHE} was not found: \`apt-get install -y apache2 libapache2-mod-oauth2\``;
  const missing = NEEDED.filter((m) => !existsSync(path.join(MODULES, m)));
  if (missing.length > 0) return `${missing.join(', ')} not in ${MODULES}: \`apt-get install -y apache2 libapache2-mod-oauth2\``;
  return undefined;
}

export interface Apache {
  readonly url: string;
  /** The error log so far (mod_oauth2 logs why it refused a token). */
  log(): string;
  stop(): Promise<void>;
}

/** Starts Apache with `locations` (the <Location> blocks, each a path and its directives). */
export async function startApache(locations: Record<string, string[]>): Promise<Apache> {
  const dir = mkdtempSync(path.join(tmpdir(), 'orgauth-apache-'));
  const port = await freePort();
  const errorLog = path.join(dir, 'error.log');
  const conf = [
    `ServerRoot "${dir}"`,
    `Listen 127.0.0.1:${port}`,
    `PidFile "${path.join(dir, 'httpd.pid')}"`,
    `ErrorLog "${errorLog}"`,
    'LogLevel warn oauth2:info',
    'ServerName localhost',
    ...NEEDED.map((m) => `LoadModule ${m.replace(/^mod_/, '').replace(/\.so$/, '')}_module ${path.join(MODULES, m)}`),
    ...(process.getuid?.() === 0 ? ['User www-data', 'Group www-data'] : []),
    `DefaultRuntimeDir "${dir}"`,
    ...Object.entries(locations).flatMap(([location, directives]) => [`<Location "${location}">`, ...directives.map((d) => `  ${d}`), '</Location>']),
  ].join('\n');
  writeFileSync(path.join(dir, 'httpd.conf'), `${conf}\n`);
  const child: ChildProcess = spawn(APACHE, ['-f', path.join(dir, 'httpd.conf'), '-DFOREGROUND'], { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout?.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr?.on('data', (d: Buffer) => (output += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
  const url = `http://127.0.0.1:${port}`;
  // Ready when it answers; it may also exit at once on a configuration error.
  const ready = (async () => {
    for (;;) {
      try {
        await fetch(`${url}/`, { signal: AbortSignal.timeout(1000) });
        return;
      } catch {
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
    }
  })();
  const outcome = await Promise.race([ready.then(() => 'ready' as const), exited.then((code) => code)]);
  if (outcome !== 'ready') throw new Error(`apache2 exited (${outcome}) before answering:\n${output}\n${existsSync(errorLog) ? readFileSync(errorLog, 'utf8') : ''}`);
  return {
    url,
    log: () => (existsSync(errorLog) ? readFileSync(errorLog, 'utf8') : ''),
    stop: async () => {
      if (child.exitCode === null) {
        child.kill('SIGTERM');
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

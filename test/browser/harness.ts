/**
 * Browser tests: Debian's Chromium driven by playwright-core against the app listening on a
 * real port. Without /usr/bin/chromium they are skipped with a notice (CI installs it).
 */
import { existsSync, mkdirSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import path from 'node:path';
import type { FastifyInstance } from 'fastify';
import type * as client from 'openid-client';
import { type Browser, chromium, type Page } from 'playwright-core';
import { expect } from 'vitest';
import { buildApp } from '../../src/app.js';
import { parseConfig } from '../../src/config.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { createLogger } from '../../src/logger.js';
import { TEST_SECRET_KEY } from '../helpers/app.js';
import { authorizationRequest as clientRequest } from '../helpers/oidc-world.js';
import { createTestDatabase } from '../helpers/db.js';
import { freePort, ROOT } from '../helpers/process.js';

export const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
export const HAS_CHROMIUM = existsSync(CHROMIUM);
if (!HAS_CHROMIUM && process.env.REQUIRE_BROWSER) throw new Error(`REQUIRE_BROWSER is set but there is no Chromium at ${CHROMIUM}`);
if (!HAS_CHROMIUM) {
  console.warn(`\n*** Browser tests SKIPPED: no Chromium at ${CHROMIUM}. Install it (apt-get install -y chromium) to run them. ***\n`);
}

/** Screenshots land here (git-ignored), to be looked at. */
export const SCREENSHOTS = path.join(ROOT, 'test-results', 'screenshots');

export interface BrowserWorld {
  app: FastifyInstance;
  baseUrl: string;
  browser: Browser;
  db: Awaited<ReturnType<typeof createTestDatabase>>;
  close(): Promise<void>;
}

/**
 * One Chromium per test worker, shared by the browser files it runs one after another (files
 * share their worker: isolate false in vitest.config.ts); each file works in contexts of its own
 * (its own cookies and storage) and closes them. Playwright ends the browser with the worker.
 */
let launched: Promise<Browser> | undefined;

function workerBrowser(): Promise<Browser> {
  const current = launched;
  if (current) return current.then((browser) => (browser.isConnected() ? browser : relaunch()));
  return relaunch();
}

function relaunch(): Promise<Browser> {
  launched = chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'],
  });
  return launched;
}

/**
 * `env`: more configuration for the app (SMTP_URL, say), on top of the harness's own.
 * `hostname`: the issuer's host; passkeys need `localhost` (an IP address is no WebAuthn RP ID).
 */
export async function startWorld(env: Record<string, string> = {}, options: { hostname?: 'localhost' | '127.0.0.1' } = {}): Promise<BrowserWorld> {
  const db = await createTestDatabase();
  const port = await freePort();
  const baseUrl = `http://${options.hostname ?? '127.0.0.1'}:${port}`;
  const config = parseConfig({ SECRET_KEY: TEST_SECRET_KEY, LOG_LEVEL: 'silent', PORT: String(port), ISSUER: baseUrl, DATA_DIR: '/nonexistent-orgauth-test', ...env });
  await ensureSigningKey(db.handle.db, { alg: config.signingAlg, secretKey: config.secretKey });
  const app = await buildApp(config, { db: db.handle.db, logger: createLogger(config), listen: db.handle.listen });
  await app.listen({ host: '127.0.0.1', port });
  const browser = await workerBrowser();
  if (TAKE_SCREENSHOTS) mkdirSync(SCREENSHOTS, { recursive: true });
  return {
    app,
    baseUrl,
    browser,
    db,
    close: async () => {
      // The browser stays for the worker's next file; what this file opened in it does not.
      await Promise.all(browser.contexts().map((context) => context.close()));
      await app.close();
      await db.close();
    },
  };
}

/**
 * Signs up as a person does: fills the sign-up form (the page `page` is on, or /signup), then
 * follows the link from the developer outbox (GET /dev/outbox, newest first) and gives the
 * password again; resolves once the browser landed where the sign-up was headed, signed in.
 */
export async function signUpThroughOutbox(page: Page, baseUrl: string, fields: { email: string; name: string; password: string; organizationName: string }): Promise<void> {
  if (new URL(page.url()).pathname !== '/signup') await page.goto(`${baseUrl}/signup`);
  await page.fill('input[name="email"]', fields.email);
  await page.fill('input[name="name"]', fields.name);
  await page.fill('input[name="password"]', fields.password);
  await page.fill('input[name="organization_name"]', fields.organizationName);
  await Promise.all([page.waitForNavigation(), page.click('button[type="submit"]')]);
  expect(await page.locator('h1').textContent()).toBe('Check your inbox');
  await page.goto(`${baseUrl}/dev/outbox`);
  const link = await page.locator('a[href*="/signup/confirm?token="]').first().getAttribute('href');
  await page.goto(new URL(link!, baseUrl).href);
  await page.fill('input[name="password"]', fields.password);
  await Promise.all([page.waitForNavigation(), page.click('form[action="/signup/confirm"] button')]);
}

/**
 * Fills the sign-in page as a person would: the email (when given), Continue (the page asks for
 * the email first), then the password. The caller submits.
 */
export async function enterPassword(page: Page, email: string | undefined, password: string): Promise<void> {
  if (email !== undefined) await page.fill('input[name="email"]', email);
  if ((await page.locator('input[name="password"]').count()) === 0) {
    await Promise.all([page.waitForSelector('input[name="password"]'), page.click('button[type="submit"]')]);
  }
  await page.fill('input[name="password"]', password);
}

/** The tallest page screenshotted whole, in CSS pixels (a whole-page screenshot lays the page out at its full height). */
const FULL_PAGE_MAX_HEIGHT = 10_000;

/**
 * With SCREENSHOTS=1, the whole page as it is now, to be looked at (nothing compares them); of a
 * longer page (the API reference: some 60,000 px at 1280 px, twice that at 375 px), what the
 * window shows. Off by default: each costs Chromium a layout at full height and a PNG (about
 * 30 s of a run's browser time), and nobody looks at a run's screenshots unless asked to.
 */
export const TAKE_SCREENSHOTS = process.env.SCREENSHOTS === '1';

export async function screenshot(page: Page, name: string): Promise<void> {
  if (!TAKE_SCREENSHOTS) return;
  const height = await page.evaluate(() => document.documentElement.scrollHeight);
  await page.screenshot({ path: path.join(SCREENSHOTS, `${name}.png`), fullPage: height <= FULL_PAGE_MAX_HEIGHT });
}

/** An authorization request of `oidc` to `rp`'s callback, with PKCE, state and nonce: its URL, and what the code grant checks. */
export const authorizationRequest = (oidc: client.Configuration, rp: CallbackServer, scope: string, extra: Record<string, string> = {}) =>
  clientRequest(oidc, scope, extra, rp.callback);

/** A tiny OAuth client's callback: answers every request and remembers the URLs it was sent. */
export class CallbackServer {
  readonly received: URL[] = [];
  private constructor(
    private readonly server: Server,
    readonly origin: string,
  ) {}

  static async start(): Promise<CallbackServer> {
    const port = await freePort();
    const origin = `http://127.0.0.1:${port}`;
    let self: CallbackServer | undefined;
    const server = createServer((req, res) => {
      self?.received.push(new URL(req.url ?? '/', origin));
      res.writeHead(200, { 'content-type': 'text/plain' }).end('client callback');
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, '127.0.0.1', () => resolve());
    });
    self = new CallbackServer(server, origin);
    return self;
  }

  get callback(): string {
    return `${this.origin}/callback`;
  }

  /** The last request to the callback path, once there is one with `param`. */
  async waitFor(param: string): Promise<URL> {
    await expect.poll(() => this.received.some((u) => u.pathname === '/callback' && u.searchParams.has(param)), { timeout: 10_000 }).toBe(true);
    return this.received.filter((u) => u.pathname === '/callback' && u.searchParams.has(param)).at(-1)!;
  }

  stop(): Promise<void> {
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}

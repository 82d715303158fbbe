import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApplication } from '../../src/oauth/models/applications.js';
import { basic, form } from '../helpers/oauth.js';
import { CallbackServer, HAS_CHROMIUM, screenshot, signUpThroughOutbox, startWorld, type BrowserWorld } from './harness.js';

describe.runIf(HAS_CHROMIUM)('in a real browser', () => {
  let world: BrowserWorld;
  /** The client's callback: a real listener, so the browser's redirect ends in a page that loads. */
  let rp: CallbackServer;
  beforeAll(async () => {
    world = await startWorld();
    rp = await CallbackServer.start();
  }, 60_000);
  afterAll(async () => {
    await rp?.stop();
    await world?.close();
  });

  it('signs up, authorizes a public application for the chosen organization, and its token reads the API', async () => {
    const { browser, baseUrl } = world;
    const page = await browser.newPage();

    await page.goto(`${baseUrl}/signup`);
    await screenshot(page, 'signup');
    await signUpThroughOutbox(page, baseUrl, { email: 'browser-user@example.com', name: 'Browser User', password: 'a long browser password', organizationName: 'Browser Org' });

    const org = await world.db.handle.db.selectFrom('organizations').select(['id']).where('name', '=', 'Browser Org').executeTakeFirstOrThrow();
    const app = await createApplication(world.db.handle.db, { organizationId: org.id, type: 'public', name: 'Browser Client', redirectUris: [rp.callback] });

    const state = 'state-from-the-browser-test-0123';
    await page.goto(
      `${baseUrl}/oauth/authorize?${new URLSearchParams({ client_id: app.client_id, redirect_uri: rp.callback, response_type: 'code', scope: 'contacts.read tasks.read', state })}`,
    );
    await expect.poll(() => page.content()).toContain('Browser Client');
    await screenshot(page, 'consent');
    await Promise.all([page.waitForURL((url) => url.href.startsWith(`${rp.callback}?`)), page.click('button[name="decision"][value="approve"]')]);
    const callback = new URL(page.url());
    expect(callback.searchParams.get('code')).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(callback.searchParams.get('state')).toBe(state);
    expect(callback.searchParams.get('iss')).toBe(baseUrl);

    const tokenRes = await fetch(`${baseUrl}/oauth/token`, {
      method: 'POST',
      headers: { authorization: basic(app.client_id, app.client_secret), 'content-type': 'application/x-www-form-urlencoded' },
      body: form({ grant_type: 'authorization_code', code: callback.searchParams.get('code')!, redirect_uri: rp.callback }),
    });
    expect(tokenRes.status).toBe(200);
    const tokens = (await tokenRes.json()) as { access_token: string; organization_id: number; organization_name: string };
    expect(tokens).toMatchObject({ organization_id: org.id, organization_name: 'Browser Org' });
    const api = await fetch(`${baseUrl}/api/v1/${tokens.organization_id}/contacts`, { headers: { authorization: `Bearer ${tokens.access_token}`, accept: 'application/json' } });
    expect(api.status).toBe(200);
    await page.close();
  });
});

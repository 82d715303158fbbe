import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApplication } from '../../src/oauth/models/applications.js';
import { basic, form } from '../helpers/oauth.js';
import { HAS_CHROMIUM, screenshot, signUpThroughOutbox, startWorld, type BrowserWorld } from './harness.js';

const CALLBACK = 'http://localhost:8765/callback';

describe.runIf(HAS_CHROMIUM)('in a real browser', () => {
  let world: BrowserWorld;
  beforeAll(async () => {
    world = await startWorld();
  }, 60_000);
  afterAll(() => world?.close());

  it('signs up, authorizes a public application for the chosen organization, and its token reads the API', async () => {
    const { browser, baseUrl } = world;
    const page = await browser.newPage();
    // The client's callback: nothing listens there, the test reads the URL the browser was sent to.
    let callback: URL | undefined;
    await page.route(`${CALLBACK}**`, async (route) => {
      callback = new URL(route.request().url());
      await route.fulfill({ status: 200, contentType: 'text/plain', body: 'client callback' });
    });

    await page.goto(`${baseUrl}/signup`);
    await screenshot(page, 'signup');
    await signUpThroughOutbox(page, baseUrl, { email: 'browser-user@example.com', name: 'Browser User', password: 'a long browser password', organizationName: 'Browser Org' });

    const org = await world.db.handle.db.selectFrom('organizations').select(['id']).where('name', '=', 'Browser Org').executeTakeFirstOrThrow();
    const app = await createApplication(world.db.handle.db, { organizationId: org.id, type: 'public', name: 'Browser Client', redirectUris: [CALLBACK] });

    const state = 'state-from-the-browser-test-0123';
    await page.goto(
      `${baseUrl}/oauth/authorize?${new URLSearchParams({ client_id: app.client_id, redirect_uri: CALLBACK, response_type: 'code', scope: 'contacts.read tasks.read', state })}`,
    );
    await expect.poll(() => page.content()).toContain('Browser Client');
    await screenshot(page, 'consent');
    await page.click('button[name="decision"][value="approve"]');
    await expect.poll(() => callback?.searchParams.get('code') ?? null, { timeout: 5000 }).not.toBeNull();
    expect(callback!.searchParams.get('state')).toBe(state);
    expect(callback!.searchParams.get('iss')).toBe(baseUrl);

    const tokenRes = await fetch(`${baseUrl}/oauth/token`, {
      method: 'POST',
      headers: { authorization: basic(app.client_id, app.client_secret), 'content-type': 'application/x-www-form-urlencoded' },
      body: form({ grant_type: 'authorization_code', code: callback!.searchParams.get('code')!, redirect_uri: CALLBACK }),
    });
    expect(tokenRes.status).toBe(200);
    const tokens = (await tokenRes.json()) as { access_token: string; organization_id: number; organization_name: string };
    expect(tokens).toMatchObject({ organization_id: org.id, organization_name: 'Browser Org' });
    const api = await fetch(`${baseUrl}/api/v1/${tokens.organization_id}/contacts`, { headers: { authorization: `Bearer ${tokens.access_token}`, accept: 'application/json' } });
    expect(api.status).toBe(200);
    await page.close();
  });
});

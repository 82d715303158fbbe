/**
 * The Overview's activity (issue 29): a scripted day — sign-ins, consents in the browser and on
 * a device, tokens of every grant type, the dashboard's and the CLI's, API calls with refusals —
 * spread over two app instances sharing the database, then the Overview's charts and totals and
 * GET /api/v1/:org/activity show exactly those counts.
 */
import { createHash, randomBytes } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ACTIVITY_METRICS, type ActivityMetric, utcDay } from '../../src/activity.js';
import { createOrganization } from '../../src/accounts/organizations.js';
import { NO_PROGRESS } from '../../src/cli/shared.js';
import { tokenCommands } from '../../src/cli/tokens.js';
import { DEVICE_CODE_GRANT } from '../../src/db/schema.js';
import { createApplication } from '../../src/oauth/models/applications.js';
import { csrfTokenIn, Browser } from '../accounts/browser.js';
import { buildTestApp, testConfig } from '../helpers/app.js';
import { BACKEND } from '../helpers/db.js';
import { hiddenIn } from '../helpers/instances.js';
import { basic, form } from '../helpers/oauth.js';
import { accessTokenIn, clientCredentials, createWorld, newOrganization, PASSWORD, selectOrganization, submit, type World } from './fixture.js';

let w: World;
/** A second instance on the same database: counts in memory of its own, written to the same rows. */
let second: FastifyInstance;
beforeAll(async () => {
  w = await createWorld();
  second = await buildTestApp(w.db);
});
afterAll(async () => {
  await second?.close();
  await w?.close();
});

const REDIRECT = 'https://client.example.com/cb';

function tokenRequest(app: FastifyInstance, fields: Record<string, string>, authorization?: string) {
  return app.inject({
    method: 'POST',
    url: '/oauth/token',
    headers: { 'content-type': 'application/x-www-form-urlencoded', ...(authorization ? { authorization } : {}) },
    payload: form(fields),
  });
}

function api(app: FastifyInstance, path: string, token?: string) {
  return app.inject({ method: 'GET', url: path, headers: { accept: 'application/json', ...(token ? { authorization: `Bearer ${token}` } : {}) } });
}

async function ccToken(app: FastifyInstance, organizationId: number, clientId: string, secret: string): Promise<string> {
  const res = await clientCredentials(app, organizationId, clientId, secret);
  expect(res.statusCode, res.body).toBe(200);
  return res.json().access_token;
}

/** Each chart's bars in the Overview: series → day → count. */
function bars(html: string): Map<string, Map<string, number>> {
  const out = new Map<string, Map<string, number>>();
  for (const group of html.matchAll(/<g data-day="([0-9-]+)">(.*?)<\/g>/g)) {
    for (const m of group[2]!.matchAll(/<rect [^>]*data-series="([a-z0-9_]+)" data-count="(\d+)"\/>/g)) {
      if (!out.has(m[1]!)) out.set(m[1]!, new Map());
      out.get(m[1]!)!.set(group[1]!, Number(m[2]));
    }
  }
  return out;
}

/** A pending invitation, as the members page would make it, expiring in `ms`. */
const invite = (organizationId: number, email: string, ms: number) =>
  w.db.insertInto('invitations').values({ organization_id: organizationId, email, role: 'member', token_hash: randomBytes(32).toString('hex'), expires_at: new Date(Date.now() + ms) }).execute();

const todayOf = (html: string, chart: string) => Number(new RegExp(`data-today="${chart}">(\\d+)<`).exec(html)?.[1]);
const totalOf = (html: string, chart: string) => Number(new RegExp(`data-total="${chart}">(\\d+)<`).exec(html)?.[1]);

describe(`the Overview's activity on ${BACKEND}, two instances`, () => {
  it('shows exactly the counts of a scripted day, in the charts, the totals and the API', async () => {
    const org = await newOrganization(w);
    const other = await newOrganization(w, { select: false });
    const [a, b] = [w.app, second];
    const expected: Record<ActivityMetric, number> = Object.fromEntries(ACTIVITY_METRICS.map((m) => [m, 0])) as Record<ActivityMetric, number>;

    // Sign-ins: three members sign in, on either instance (each counts in every organization they belong to).
    for (const [app, who] of [[a, w.users.owner], [b, w.users.member], [b, w.users.admin]] as const) {
      expect((await new Browser(app, '10.30.0.1').login(who.email, PASSWORD)).statusCode).toBe(303);
      expected.sign_ins++;
    }

    // A consent in the browser (instance a), its code exchanged on b, the refresh on a.
    const owner = new Browser(a, '10.30.0.2');
    expect((await owner.login(w.users.owner.email, PASSWORD)).statusCode).toBe(303);
    expected.sign_ins++;
    const verifier = randomBytes(32).toString('base64url');
    const challenge = createHash('sha256').update(verifier).digest('base64url');
    const query = new URLSearchParams({ response_type: 'code', client_id: org.publicApp.client_id, redirect_uri: REDIRECT, scope: 'contacts.read', state: 'state-of-the-scripted-day', code_challenge: challenge, code_challenge_method: 'S256' });
    const consent = await owner.get(`/oauth/authorize?${query}`);
    expect(consent.statusCode, `${consent.headers.location} ${consent.body}`).toBe(200);
    const approved = await owner.post('/oauth/authorize', { ...hiddenIn(consent.body), organization_id: String(org.id), decision: 'approve' });
    expect(approved.statusCode, approved.body).toBe(303);
    expected.consents++;
    const code = new URL(approved.headers.location as string).searchParams.get('code')!;
    const publicAuth = basic(org.publicApp.client_id, org.publicApp.client_secret);
    const exchanged = await tokenRequest(b, { grant_type: 'authorization_code', code, redirect_uri: REDIRECT, code_verifier: verifier }, publicAuth);
    expect(exchanged.statusCode, exchanged.body).toBe(200);
    expected.tokens_authorization_code++;
    const refreshed = await tokenRequest(a, { grant_type: 'refresh_token', refresh_token: exchanged.json().refresh_token }, publicAuth);
    expect(refreshed.statusCode, refreshed.body).toBe(200);
    expected.tokens_refresh_token++;

    // The device grant: started and polled on b, approved by the member in a browser on a.
    const device = await createApplication(w.db, { organizationId: org.id, type: 'public', name: 'TV', redirectUris: [REDIRECT] });
    await w.db.updateTable('applications').set({ token_endpoint_auth_method: 'none', client_secret_hash: null, grant_types: ['authorization_code', 'refresh_token', DEVICE_CODE_GRANT] }).where('client_id', '=', device.client_id).execute();
    const started = await b.inject({ method: 'POST', url: '/oauth/device_authorization', headers: { 'content-type': 'application/x-www-form-urlencoded' }, payload: form({ client_id: device.client_id, scope: 'contacts.read' }) });
    expect(started.statusCode, started.body).toBe(200);
    const { device_code, user_code } = started.json();
    const member = new Browser(a, '10.30.0.3');
    expect((await member.login(w.users.member.email, PASSWORD)).statusCode).toBe(303);
    expected.sign_ins++;
    const entered = await member.post('/device', { csrf_token: await member.csrf('/device'), user_code });
    expect(entered.statusCode, entered.body).toBe(200);
    const decided = await member.post('/device', { csrf_token: csrfTokenIn(entered.body), user_code, decision: 'approve', organization_id: String(org.id) });
    expect(decided.statusCode, decided.body).toBe(200);
    expected.consents++;
    const polled = await tokenRequest(b, { grant_type: DEVICE_CODE_GRANT, device_code, client_id: device.client_id });
    expect(polled.statusCode, polled.body).toBe(200);
    expected.tokens_device_code++;

    // client_credentials on both instances; Generate Token in the dashboard; the CLI.
    const tokenA = await ccToken(a, org.id, org.privateApp.client_id, org.privateApp.client_secret);
    await ccToken(a, org.id, org.privateApp.client_id, org.privateApp.client_secret);
    const tokenB = await ccToken(b, org.id, org.privateApp.client_id, org.privateApp.client_secret);
    expected.tokens_client_credentials += 3;
    const generated = await submit(w.browsers.owner, `/dashboard/applications/${org.privateApp.client_id}/token`, { scopes: 'contacts.read' });
    expect(generated.statusCode, generated.body).toBe(200);
    expect(accessTokenIn(generated.body)).toBeTruthy();
    expected.tokens_dashboard++;
    const cli = tokenCommands['token create']!;
    await cli.run({ db: w.db, config: testConfig(), applied: [], progress: () => NO_PROGRESS }, { 'client-id': org.privateApp.client_id } as Parameters<typeof cli.run>[1]);
    expected.tokens_cli++;

    // The API: three answers and a 404 with the organization's tokens; its tokens refused for
    // a scope they lack, on another organization's path and after revocation (refused tokens,
    // counted for the token's organization). Neither a request without a token nor one with a
    // token this server did not sign counts for anyone (nobody can inflate another's counts),
    // and another organization's token on this one's path counts for that organization.
    for (const [app, token] of [[a, tokenA], [a, tokenA], [b, tokenB]] as const) expect((await api(app, `/api/v1/${org.id}/contacts`, token)).statusCode).toBe(200);
    expected.api_2xx += 3;
    expect((await api(b, `/api/v1/${org.id}/contacts/999999999`, tokenB)).statusCode).toBe(404);
    expect((await api(a, `/api/v1/${org.id}/members`, tokenA)).statusCode).toBe(403);
    expect((await api(b, `/api/v1/987654321/contacts`, tokenB)).statusCode).toBe(403);
    const revoked = await ccToken(a, org.id, org.privateApp.client_id, org.privateApp.client_secret);
    expected.tokens_client_credentials++;
    const revocation = await a.inject({ method: 'POST', url: '/oauth/revoke', headers: { authorization: basic(org.privateApp.client_id, org.privateApp.client_secret), 'content-type': 'application/x-www-form-urlencoded' }, payload: form({ token: revoked }) });
    expect(revocation.statusCode).toBe(200);
    expect((await api(a, `/api/v1/${org.id}/contacts`, revoked)).statusCode).toBe(401);
    expected.api_4xx += 4;
    expected.api_refused += 3;
    expect((await api(a, `/api/v1/${org.id}/contacts`)).statusCode).toBe(401);
    expect((await api(a, `/api/v1/${org.id}/contacts`, 'not-a-token')).statusCode).toBe(401);
    const otherToken = await ccToken(b, other.id, other.privateApp.client_id, other.privateApp.client_secret);
    expect((await api(b, `/api/v1/${org.id}/contacts`, otherToken)).statusCode).toBe(403);

    // Each instance writes what it counted.
    await a.activity.flush();
    await b.activity.flush();

    const today = utcDay();
    const page = await w.browsers.owner.get('/dashboard');
    expect(page.statusCode).toBe(200);
    const drawn = bars(page.body);
    for (const metric of ACTIVITY_METRICS) {
      expect(drawn.get(metric)?.get(today) ?? 0, metric).toBe(expected[metric]);
      // Nothing on other days.
      expect([...(drawn.get(metric)?.keys() ?? [])].filter((d) => d !== today), metric).toEqual([]);
    }
    const tokens = ACTIVITY_METRICS.filter((m) => m.startsWith('tokens_')).reduce((s, m) => s + expected[m], 0);
    expect(tokens).toBe(9);
    for (const [chart, n] of [
      ['chart-sign-ins', expected.sign_ins],
      ['chart-consents', expected.consents],
      ['chart-tokens', tokens],
      ['chart-api', expected.api_2xx + expected.api_4xx],
      ['chart-refused', expected.api_refused],
    ] as const) {
      expect(todayOf(page.body, chart), chart).toBe(n);
      expect(totalOf(page.body, chart), chart).toBe(n);
    }
    expect(page.body).toContain(`<desc id="chart-sign-ins-desc">${expected.sign_ins} sign-ins from`);

    // The management API: the same series (a token of an application that may read the audit log).
    const reporter = await createApplication(w.db, { organizationId: org.id, type: 'private', name: 'Reporter', scopes: 'audit.read' });
    const reporterToken = await ccToken(a, org.id, reporter.client_id, reporter.client_secret);
    const series = await api(a, `/api/v1/${org.id}/activity`, reporterToken);
    expect(series.statusCode, series.body).toBe(200);
    const body = series.json();
    expect(body.to).toBe(today);
    expect(body.days).toHaveLength(30);
    expect(body.metrics).toEqual([...ACTIVITY_METRICS]);
    expect(body.days.at(-1)).toEqual({ day: today, counts: expected });
    expect(body.totals).toEqual(expected);

    const oneDay = await api(a, `/api/v1/${org.id}/activity?from=${today}&to=${today}`, reporterToken);
    expect(oneDay.json().days).toHaveLength(1);
    // The other organization: its one token, refused on this organization's path (and a sign-in for each of its members who signed in).
    const otherRows = await w.db.selectFrom('activity_daily').select(['metric', 'count']).where('organization_id', '=', other.id).where('metric', 'not in', ['sign_ins']).orderBy('metric').execute();
    expect(otherRows).toEqual([{ metric: 'api_4xx', count: 1 }, { metric: 'api_refused', count: 1 }, { metric: 'tokens_client_credentials', count: 1 }]);
    expect(await w.db.selectFrom('activity_daily').select('metric').where('organization_id', '=', 987654321).execute()).toEqual([]);
  });

  it('refuses a bad range and needs the audit.read scope', async () => {
    const org = await newOrganization(w, { select: false });
    const reporter = await createApplication(w.db, { organizationId: org.id, type: 'private', name: 'Reporter', scopes: 'audit.read' });
    const token = await ccToken(w.app, org.id, reporter.client_id, reporter.client_secret);
    for (const q of ['from=2026-02-30', 'to=yesterday', 'from=2026-11-20&to=2026-11-10', 'from=2020-01-01&to=2026-01-01', 'from=2026-1-1']) {
      const res = await api(w.app, `/api/v1/${org.id}/activity?${q}`, token);
      expect(res.statusCode, q).toBe(400);
      expect(res.json().error).toBe('invalid_request');
    }
    const year = await api(w.app, `/api/v1/${org.id}/activity?from=2025-01-01&to=2025-12-31`, token);
    expect(year.statusCode).toBe(200);
    expect(year.json().days).toHaveLength(365);
    const plain = await ccToken(w.app, org.id, org.privateApp.client_id, org.privateApp.client_secret);
    expect((await api(w.app, `/api/v1/${org.id}/activity`, plain)).statusCode).toBe(403);
  });
});

describe(`the Overview's first run and attention items on ${BACKEND}`, () => {
  it('shows a checklist that ticks itself, with the organization in its curl, until done or dismissed', async () => {
    const org = await createOrganization(w.db, { name: 'Fresh Org', ownerUserId: w.users.owner.id });
    await selectOrganization(w.browsers.owner, org.id);
    const steps = async () => {
      const page = await w.browsers.owner.get('/dashboard');
      return [...page.body.matchAll(/<li class="(done|todo)" data-done="(true|false)">/g)].map((m) => m[1]);
    };
    const first = await w.browsers.owner.get('/dashboard');
    expect(first.body).toContain('Get started');
    expect(first.body).toContain(`/api/v1/${org.id}/contacts`);
    expect(first.body).toContain(`-d organization_id=${org.id}`);
    expect(await steps()).toEqual(['todo', 'todo', 'todo', 'todo']);

    const app = await createApplication(w.db, { organizationId: org.id, type: 'private', name: 'First', scopes: 'contacts.read' });
    expect(await steps()).toEqual(['done', 'todo', 'todo', 'todo']);
    const token = await ccToken(w.app, org.id, app.client_id, app.client_secret);
    expect(await steps()).toEqual(['done', 'done', 'todo', 'todo']);
    expect((await api(w.app, `/api/v1/${org.id}/contacts`, token)).statusCode).toBe(200);
    await w.app.activity.flush();
    expect(await steps()).toEqual(['done', 'done', 'done', 'todo']);
    await invite(org.id, 'teammate@example.com', 7 * 86_400_000);
    // All done: the checklist is gone.
    expect(await steps()).toEqual([]);
    expect((await w.browsers.owner.get('/dashboard')).body).not.toContain('Get started');
  });

  it('is dismissed for the organization by those who manage applications only', async () => {
    const org = await newOrganization(w);
    await w.db.deleteFrom('memberships').where('organization_id', '=', org.id).where('user_id', '!=', w.users.owner.id).where('user_id', '!=', w.users.member.id).execute();
    // The member sees no checklist (nothing there is theirs to do) and may not dismiss it.
    await selectOrganization(w.browsers.member, org.id);
    expect((await w.browsers.member.get('/dashboard')).body).not.toContain('Get started');
    expect((await submit(w.browsers.member, '/dashboard/checklist/dismiss')).statusCode).toBe(403);
    expect((await w.browsers.owner.get('/dashboard')).body).toContain('Get started');
    const dismissed = await submit(w.browsers.owner, '/dashboard/checklist/dismiss');
    expect(dismissed.statusCode).toBe(303);
    expect(dismissed.headers.location).toBe('/dashboard');
    const after = await w.browsers.owner.get('/dashboard');
    expect(after.body).not.toContain('Get started');
    expect(after.body).toContain(`The first-run checklist is put away for everyone in ${org.name}.`);
    // Said once.
    expect((await w.browsers.owner.get('/dashboard')).body).not.toContain('The first-run checklist is put away');
    // No CSRF token: refused.
    expect((await w.browsers.owner.post('/dashboard/checklist/dismiss', {})).statusCode).toBe(403);
  });

  it('counts members, invitations, applications and live grants, and lists what needs attention', async () => {
    const org = await newOrganization(w);
    const page = async () => (await w.browsers.owner.get('/dashboard')).body;
    const tile = (html: string, name: string) => new RegExp(`data-count="${name}"><a href="[^"]+"><strong>([^<]+)</strong>`).exec(html)?.[1];
    let html = await page();
    expect(tile(html, 'members')).toBe('3');
    expect(tile(html, 'invitations')).toBe('0');
    expect(tile(html, 'applications')).toBe('2');
    expect(tile(html, 'grants')).toBe('0');
    expect(html).not.toContain('Needs attention');

    // An invitation about to expire, an application nobody used for days, an old signing key.
    await invite(org.id, 'late@example.com', 5 * 3_600_000);
    await w.db.updateTable('applications').set({ created_at: new Date(Date.now() - 3 * 86_400_000) }).where('client_id', '=', org.publicApp.client_id).execute();
    await ccToken(w.app, org.id, org.privateApp.client_id, org.privateApp.client_secret);
    await w.db.updateTable('applications').set({ created_at: new Date(Date.now() - 3 * 86_400_000) }).where('client_id', '=', org.privateApp.client_id).execute();
    const keys = await w.db.selectFrom('signing_keys').select(['kid', 'created_at']).where('retired_at', 'is', null).execute();
    await w.db.updateTable('signing_keys').set({ created_at: new Date(Date.now() - 200 * 86_400_000) }).where('retired_at', 'is', null).execute();
    try {
      html = await page();
      expect(tile(html, 'invitations')).toBe('1');
      expect(tile(html, 'grants')).toBe('1');
      expect(html).toContain('Needs attention');
      expect(html).toMatch(/The invitation to late@example.com expires in [45] hours/);
      expect(html).toContain('Web has never been used');
      expect(html).not.toContain('Backend has never been used');
      expect(html).toMatch(/signing key is 200 days old/);
      // A member sees neither the invitations nor the key.
      await selectOrganization(w.browsers.member, org.id);
      const seen = (await w.browsers.member.get('/dashboard')).body;
      expect(seen).not.toContain('late@example.com');
      expect(seen).not.toContain('signing key');
    } finally {
      for (const k of keys) await w.db.updateTable('signing_keys').set({ created_at: k.created_at }).where('kid', '=', k.kid).execute();
    }
  });
});

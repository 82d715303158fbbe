import { exportJWK, generateKeyPair } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BACKEND } from '../helpers/db.js';
import { changeMemberRole } from '../../src/accounts/organizations.js';
import { createRole } from '../../src/accounts/roles.js';
import { createApplication } from '../../src/oauth/models/applications.js';
import { expectPageSecurityHeaders } from '../accounts/browser.js';
import { finishJobs } from '../helpers/jobs.js';
import {
  accessTokenIn,
  clientCredentials,
  createWorld,
  grantRow,
  listContacts,
  newOrganization,
  type RoleName,
  secretIn,
  submit,
  userGrant,
  type World,
} from './fixture.js';

let w: World;
beforeAll(async () => {
  w = await createWorld();
});
afterAll(async () => {
  await w?.close();
});

const auditActions = async (organizationId: number) =>
  (await w.db.selectFrom('audit_events').select('action').where('organization_id', '=', organizationId).orderBy('id').execute()).map((e) => e.action);

describe(`dashboard applications on ${BACKEND}`, () => {
  it('lists the applications of the current organization, with create forms for owners and admins only', async () => {
    const org = await newOrganization(w);
    for (const role of ['owner', 'admin'] as const) {
      const res = await w.browsers[role].get('/dashboard/applications');
      expect(res.statusCode).toBe(200);
      expectPageSecurityHeaders(res);
      expect(res.body).toContain(`href="/dashboard/applications/${org.privateApp.client_id}"`);
      expect(res.body).toContain('>Create application</button>');
      expect(res.body).toContain('>Create private application</button>');
      expect(res.body).not.toMatch(/(src|href|action)="https?:/);
    }
    const member = await w.browsers.member.get('/dashboard/applications');
    expect(member.statusCode).toBe(200);
    expect(member.body).toContain(`href="/dashboard/applications/${org.publicApp.client_id}"`);
    expect(member.body).not.toContain('<form method="post" action="/dashboard/applications"');
    const page = await w.browsers.member.get(`/dashboard/applications/${org.privateApp.client_id}`);
    expect(page.statusCode).toBe(200);
    expect(page.body).toContain(org.privateApp.client_id);
    expect(page.body).not.toMatch(/Rotate secret|Generate Token|Save changes|Disable application|Delete application/);
  });

  it('sends a signed-out visitor to the login page and refuses a signed-out POST', async () => {
    const res = await w.app.inject({ method: 'GET', url: '/dashboard/applications' });
    expect(res.statusCode).toBe(303);
    expect(res.headers.location).toBe('/login?return_to=%2Fdashboard%2Fapplications');
    expectPageSecurityHeaders(res);
    const post = await w.app.inject({ method: 'POST', url: '/dashboard/applications', payload: { name: 'x' } });
    expect(post.statusCode).toBe(403);
  });

  it('creates a public application, showing its secret once and never on the application page', async () => {
    const org = await newOrganization(w);
    const res = await submit(w.browsers.admin, '/dashboard/applications', {
      type: 'public',
      name: 'Mobile <app>',
      redirect_uris: 'https://app.example.com/cb\r\nhttp://localhost:8080/cb\r\n',
      scopes: ['contacts.read', 'tasks.read'],
      require_pkce: 'on',
    });
    expect(res.statusCode).toBe(201);
    expect(res.headers['cache-control']).toBe('no-store');
    expect(res.headers.location).toBeUndefined();
    expect(res.body).toContain('Mobile &lt;app&gt;');
    const secret = secretIn(res.body);
    expect(secret).toMatch(/^[A-Za-z0-9_-]{43}$/);
    const row = await w.db.selectFrom('applications').selectAll().where('organization_id', '=', org.id).where('name', '=', 'Mobile <app>').executeTakeFirstOrThrow();
    expect(row).toMatchObject({
      type: 'public',
      redirect_uris: ['https://app.example.com/cb', 'http://localhost:8080/cb'],
      scopes: ['contacts.read', 'tasks.read'],
      require_pkce: true,
    });
    expect(row.client_secret_hash).not.toContain(secret);
    expect(res.body).toContain(row.client_id);
    const again = await w.browsers.admin.get(`/dashboard/applications/${row.client_id}`);
    expect(again.statusCode).toBe(200);
    expect(again.body).toContain(row.client_id);
    expect(again.body).not.toContain(secret);
    expect(secretIn(again.body)).toBeUndefined();
    expect(await auditActions(org.id)).toContain('application.created');
  });

  it('creates a private application whose secret works for client_credentials', async () => {
    const org = await newOrganization(w);
    const res = await submit(w.browsers.owner, '/dashboard/applications', { type: 'private', name: 'Cron', scopes: ['tasks.read'] });
    expect(res.statusCode).toBe(201);
    const row = await w.db.selectFrom('applications').selectAll().where('organization_id', '=', org.id).where('name', '=', 'Cron').executeTakeFirstOrThrow();
    expect(row).toMatchObject({ type: 'private', redirect_uris: [], scopes: ['tasks.read'] });
    const token = await clientCredentials(w.app, org.id, row.client_id, secretIn(res.body) ?? '');
    expect(token.statusCode).toBe(200);
    expect(token.json()).toMatchObject({ scope: 'tasks.read', organization_id: org.id });
  });

  it('re-shows the form with the problems for a bad redirect URI, no name or no scope, and creates nothing', async () => {
    const org = await newOrganization(w);
    const res = await submit(w.browsers.owner, '/dashboard/applications', {
      type: 'public',
      name: '',
      redirect_uris: 'http://evil.example.com/cb\nhttps://ok.example.com/cb#frag',
    });
    expect(res.statusCode).toBe(400);
    expect(res.body).toContain('Enter a name.');
    expect(res.body).toContain('http is allowed only for loopback hosts');
    expect(res.body).toContain('must not contain a fragment');
    expect(res.body).toContain('Choose at least one scope.');
    expect(res.body).toContain('http://evil.example.com/cb\nhttps://ok.example.com/cb#frag</textarea>');
    expect(await w.db.selectFrom('applications').select('id').where('organization_id', '=', org.id).execute()).toHaveLength(2);
  });

  it('offers the management scopes for private applications only, and refuses them for a public one (AD-1)', async () => {
    const org = await newOrganization(w);
    const page = (await w.browsers.owner.get('/dashboard/applications')).body;
    const form = (type: string) => page.slice(page.indexOf(`name="type" value="${type}"`), page.indexOf('</form>', page.indexOf(`name="type" value="${type}"`)));
    expect(form('public')).toContain('value="contacts.read"');
    expect(form('public')).not.toMatch(/value="(applications|members|grants|audit)\./);
    for (const scope of ['applications.read', 'applications.write', 'members.read', 'members.write', 'grants.read', 'grants.write', 'audit.read']) {
      expect(form('private')).toContain(`value="${scope}"`);
    }
    const publicEdit = (await w.browsers.owner.get(`/dashboard/applications/${org.publicApp.client_id}`)).body;
    expect(publicEdit).not.toMatch(/value="(applications|members|grants|audit)\./);

    const refused = await submit(w.browsers.owner, '/dashboard/applications', {
      type: 'public', name: 'Greedy', redirect_uris: 'https://ok.example.com/cb', scopes: ['contacts.read', 'members.write'],
    });
    expect(refused.statusCode).toBe(400);
    expect(refused.body).toContain('Choose only the scopes listed.');
    const edit = await submit(w.browsers.owner, `/dashboard/applications/${org.publicApp.client_id}`, {
      name: 'Web', redirect_uris: 'https://client.example.com/cb', scopes: ['contacts.read', 'audit.read'],
    });
    expect(edit.statusCode).toBe(400);

    const admin = await submit(w.browsers.owner, '/dashboard/applications', { type: 'private', name: 'Admin bot', scopes: ['applications.read', 'audit.read'] });
    expect(admin.statusCode).toBe(201);
    const row = await w.db.selectFrom('applications').select(['client_id', 'scopes']).where('organization_id', '=', org.id).where('name', '=', 'Admin bot').executeTakeFirstOrThrow();
    expect(row.scopes).toEqual(['applications.read', 'audit.read']);
    // Generate Token offers them for it, and the token works on the management API.
    const generated = await submit(w.browsers.owner, `/dashboard/applications/${row.client_id}/token`, { scopes: ['applications.read'] });
    const token = accessTokenIn(generated.body) ?? '';
    const listed = await w.app.inject({ method: 'GET', url: `/api/v1/${org.id}/applications`, headers: { authorization: `Bearer ${token}` } });
    expect(listed.statusCode).toBe(200);
    expect(listed.json().data.map((a: { name: string }) => a.name)).toEqual(['Backend', 'Web', 'Admin bot']);
  });

  it('shows the forms only to a role holding all of an application’s scopes, and keeps a public application’s redirect URIs out of the reach of other roles', async () => {
    const org = await newOrganization(w);
    const role = await createRole(w.db, org.id, { name: 'Readers who manage apps', permissions: ['applications.write', 'contacts.read', 'tasks.read'] });
    await changeMemberRole(w.db, { organizationId: org.id, userId: w.users.member.id, role });
    // The public Web application holds contacts.write: re-pointing its redirect URIs would let
    // this role collect codes of users whose roles hold more.
    const page = await w.browsers.member.get(`/dashboard/applications/${org.publicApp.client_id}`);
    expect(page.statusCode).toBe(200);
    expect(page.body).toContain('out-of-reach');
    expect(page.body).not.toContain('Save changes');
    const edit = await submit(w.browsers.member, `/dashboard/applications/${org.publicApp.client_id}`, {
      name: 'Web', redirect_uris: 'https://attacker.example.com/cb', scopes: ['contacts.read', 'contacts.write', 'tasks.read'],
    });
    expect(edit.statusCode).toBe(403);
    const row = await w.db.selectFrom('applications').select('redirect_uris').where('client_id', '=', org.publicApp.client_id).executeTakeFirstOrThrow();
    expect(row.redirect_uris).toEqual(['https://client.example.com/cb']);
    // Nor may it register an application (public or private) with a scope it lacks.
    for (const type of ['public', 'private']) {
      const res = await submit(w.browsers.member, '/dashboard/applications', { type, name: `Wide ${type}`, redirect_uris: 'https://w.example.com/cb', scopes: ['contacts.write'] });
      expect(res.statusCode, type).toBe(403);
      expect(res.body).toContain('Your role does not hold contacts.write');
    }
    expect((await w.db.selectFrom('applications').select('name').where('organization_id', '=', org.id).where('name', 'like', 'Wide%').execute())).toEqual([]);
    // The private Backend application (contacts.read tasks.read) is within the role: its forms show.
    const backend = await w.browsers.member.get(`/dashboard/applications/${org.privateApp.client_id}`);
    expect(backend.body).not.toContain('out-of-reach');
    expect(backend.body).toContain('Rotate secret');
  });

  it('refuses members (403) and creates nothing', async () => {
    const org = await newOrganization(w);
    const res = await submit(w.browsers.member, '/dashboard/applications', { type: 'private', name: 'Nope', scopes: ['tasks.read'] });
    expect(res.statusCode).toBe(403);
    expectPageSecurityHeaders(res);
    expect(await w.db.selectFrom('applications').select('id').where('organization_id', '=', org.id).execute()).toHaveLength(2);
  });

  it('rotates the secret: the new one is shown once and works, the old one stops at once', async () => {
    const org = await newOrganization(w);
    // Asked first: the old secret still works until the confirmation page's form is sent.
    const ask = await submit(w.browsers.owner, `/dashboard/applications/${org.privateApp.client_id}/secret`);
    expect(ask.statusCode).toBe(200);
    expect(secretIn(ask.body)).toBeUndefined();
    expect((await clientCredentials(w.app, org.id, org.privateApp.client_id, org.privateApp.client_secret)).statusCode).toBe(200);
    const res = await submit(w.browsers.owner, `/dashboard/applications/${org.privateApp.client_id}/secret`, { confirm: 'rotate' });
    expect(res.statusCode).toBe(200);
    expect(res.headers['cache-control']).toBe('no-store');
    const secret = secretIn(res.body) ?? '';
    expect(secret).not.toBe(org.privateApp.client_secret);
    expect((await clientCredentials(w.app, org.id, org.privateApp.client_id, org.privateApp.client_secret)).statusCode).toBe(401);
    expect((await clientCredentials(w.app, org.id, org.privateApp.client_id, secret)).statusCode).toBe(200);
    expect((await w.browsers.owner.get(`/dashboard/applications/${org.privateApp.client_id}`)).body).not.toContain(secret);
    expect(await auditActions(org.id)).toContain('application.secret_rotated');
  });

  it('generates a token for the current organization that works on the API, shown once', async () => {
    const org = await newOrganization(w);
    const res = await submit(w.browsers.admin, `/dashboard/applications/${org.privateApp.client_id}/token`, { scopes: ['contacts.read'] });
    expect(res.statusCode).toBe(200);
    expect(res.headers['cache-control']).toBe('no-store');
    const token = accessTokenIn(res.body) ?? '';
    expect(token).toMatch(/^ey/);
    const api = await listContacts(w.app, org.id, token);
    expect(api.statusCode).toBe(200);
    // The scope chosen, not all of the application's.
    expect((await w.app.inject({ method: 'GET', url: `/api/v1/${org.id}/tasks`, headers: { authorization: `Bearer ${token}` } })).statusCode).toBe(403);
    expect((await w.browsers.admin.get(`/dashboard/applications/${org.privateApp.client_id}`)).body).not.toContain(token);
    expect(await auditActions(org.id)).toEqual(expect.arrayContaining(['grant.created', 'application.token_generated']));
  });

  it('refuses to generate a token with a scope the application does not have, or for a public application', async () => {
    const org = await newOrganization(w);
    const res = await submit(w.browsers.owner, `/dashboard/applications/${org.privateApp.client_id}/token`, { scopes: ['contacts.write'] });
    expect(res.statusCode).toBe(400);
    expect(accessTokenIn(res.body)).toBeUndefined();
    expect((await submit(w.browsers.owner, `/dashboard/applications/${org.publicApp.client_id}/token`, { scopes: ['contacts.read'] })).statusCode).toBe(404);
    expect(await w.db.selectFrom('grants').select('id').where('organization_id', '=', org.id).execute()).toEqual([]);
  });

  it('sets the security settings: keys for private_key_jwt (the secret stops), DPoP, PAR, the ID token algorithm, FAPI 2.0; refused settings change nothing', async () => {
    const org = await newOrganization(w);
    const url = `/dashboard/applications/${org.publicApp.client_id}/security`;
    const page = await w.browsers.owner.get(`/dashboard/applications/${org.publicApp.client_id}`);
    expect(page.body).toContain(`action="${url}"`);
    expect(page.body).toContain('Signed with <code>RS256</code>');
    const row = () => w.db.selectFrom('applications').selectAll().where('client_id', '=', org.publicApp.client_id).executeTakeFirstOrThrow();
    // FAPI 2.0 with a secret: refused, with the reason, nothing changed.
    const refused = await submit(w.browsers.owner, url, { token_endpoint_auth_method: 'client_secret_basic', fapi2: 'on', dpop_bound_access_tokens: 'on' });
    expect(refused.statusCode).toBe(400);
    expect(refused.body).toContain('private_key_jwt');
    expect(await row()).toMatchObject({ fapi2: false, dpop_bound_access_tokens: false });
    // Not JSON, or a private key: refused.
    expect((await submit(w.browsers.owner, url, { token_endpoint_auth_method: 'private_key_jwt', jwks: 'not json' })).statusCode).toBe(400);
    const { privateKey, publicKey } = await generateKeyPair('ES256', { extractable: true });
    const privateRefused = await submit(w.browsers.owner, url, { token_endpoint_auth_method: 'private_key_jwt', jwks: JSON.stringify({ keys: [await exportJWK(privateKey)] }) });
    expect(privateRefused.statusCode).toBe(400);
    expect((await row()).token_endpoint_auth_method).toBe('client_secret_basic');
    // Keys, DPoP, PAR, ES256 ID tokens and FAPI 2.0 together.
    const saved = await submit(w.browsers.owner, url, {
      token_endpoint_auth_method: 'private_key_jwt',
      jwks: JSON.stringify({ keys: [{ ...(await exportJWK(publicKey)), kid: 'dash-1' }] }),
      jwks_uri: '',
      dpop_bound_access_tokens: 'on',
      require_pushed_authorization_requests: 'on',
      id_token_signed_response_alg: 'ES256',
      fapi2: 'on',
    });
    expect(saved.statusCode, saved.body).toBe(303);
    expect(await row()).toMatchObject({
      token_endpoint_auth_method: 'private_key_jwt', client_secret_hash: null, jwks_uri: null, dpop_bound_access_tokens: true,
      require_pushed_authorization_requests: true, id_token_signed_response_alg: 'ES256', fapi2: true,
    });
    expect((await row()).jwks?.keys[0]).toMatchObject({ kid: 'dash-1', kty: 'EC' });
    const shown = (await w.browsers.owner.get(`/dashboard/applications/${org.publicApp.client_id}`)).body;
    expect(shown).toContain('<code>private_key_jwt</code>, 1 registered key');
    expect(shown).toContain('DPoP-bound (a proof is required)');
    // The old secret no longer authenticates.
    const token = await w.app.inject({
      method: 'POST', url: '/oauth/token',
      headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: `Basic ${Buffer.from(`${org.publicApp.client_id}:${org.publicApp.client_secret}`).toString('base64')}` },
      payload: 'grant_type=refresh_token&refresh_token=x',
    });
    expect(token.statusCode).toBe(401);
    expect(await auditActions(org.id)).toContain('application.updated');
  });

  it('generates no token for an application whose tokens must be DPoP-bound', async () => {
    const org = await newOrganization(w);
    const url = `/dashboard/applications/${org.privateApp.client_id}`;
    expect((await submit(w.browsers.owner, `${url}/security`, { token_endpoint_auth_method: 'client_secret_basic', dpop_bound_access_tokens: 'on' })).statusCode).toBe(303);
    const res = await submit(w.browsers.owner, `${url}/token`, { scopes: ['contacts.read'] });
    expect(res.statusCode).toBe(400);
    expect(res.body).toContain('DPoP-bound');
    expect(accessTokenIn(res.body)).toBeUndefined();
  });

  it('edits name and redirect URIs without revoking anything when no scope is removed', async () => {
    const org = await newOrganization(w);
    const grant = await userGrant(w, org, w.users.member.id, ['contacts.read']);
    const res = await submit(w.browsers.owner, `/dashboard/applications/${org.publicApp.client_id}`, {
      name: 'Web 2',
      redirect_uris: 'https://client.example.com/cb2',
      scopes: ['contacts.read', 'contacts.write', 'tasks.read', 'tasks.write'],
    });
    expect(res.statusCode).toBe(303);
    expect(res.headers.location).toBe(`/dashboard/applications/${org.publicApp.client_id}`);
    const row = await w.db.selectFrom('applications').selectAll().where('client_id', '=', org.publicApp.client_id).executeTakeFirstOrThrow();
    expect(row).toMatchObject({ name: 'Web 2', redirect_uris: ['https://client.example.com/cb2'], scopes: ['contacts.read', 'contacts.write', 'tasks.read', 'tasks.write'] });
    expect((await grantRow(w, grant)).revoked_at).toBeNull();
    expect(await auditActions(org.id)).toContain('application.updated');
  });

  it('registers post-logout redirect URIs on a public application: created, shown, edited, kept through the scope confirmation', async () => {
    const org = await newOrganization(w);
    const blank = (await w.browsers.owner.get('/dashboard/applications')).body;
    const publicForm = blank.slice(blank.indexOf('name="type" value="public"'), blank.indexOf('</form>', blank.indexOf('name="type" value="public"')));
    const privateForm = blank.slice(blank.indexOf('name="type" value="private"'), blank.indexOf('</form>', blank.indexOf('name="type" value="private"')));
    expect(publicForm).toContain('<textarea name="post_logout_redirect_uris"');
    expect(privateForm).not.toContain('post_logout_redirect_uris');

    const created = await submit(w.browsers.owner, '/dashboard/applications', {
      type: 'public',
      name: 'Signs out',
      redirect_uris: 'https://app.example.com/cb',
      post_logout_redirect_uris: 'https://app.example.com/bye\r\n\r\nhttp://localhost:8080/bye?x=1&y=2\r\nhttps://app.example.com/bye\r\n',
      scopes: ['contacts.read', 'tasks.read'],
    });
    expect(created.statusCode, created.body).toBe(201);
    const row = await w.db.selectFrom('applications').selectAll().where('organization_id', '=', org.id).where('name', '=', 'Signs out').executeTakeFirstOrThrow();
    // One per line, blank lines skipped and repeats dropped, as for redirect URIs.
    expect(row.post_logout_redirect_uris).toEqual(['https://app.example.com/bye', 'http://localhost:8080/bye?x=1&y=2']);
    const page = (await w.browsers.admin.get(`/dashboard/applications/${row.client_id}`)).body;
    expect(page).toContain('<dt>Post-logout redirect URIs</dt><dd><code>https://app.example.com/bye</code><br><code>http://localhost:8080/bye?x=1&amp;y=2</code><br></dd>');
    expect(page).toContain('<textarea name="post_logout_redirect_uris" rows="2">https://app.example.com/bye\nhttp://localhost:8080/bye?x=1&amp;y=2</textarea>');

    const fields = { name: 'Signs out', redirect_uris: 'https://app.example.com/cb', post_logout_redirect_uris: 'https://app.example.com/after-logout', scopes: ['contacts.read', 'tasks.read'] };
    expect((await submit(w.browsers.owner, `/dashboard/applications/${row.client_id}`, fields)).statusCode).toBe(303);
    const changed = await w.db.selectFrom('applications').select(['redirect_uris', 'post_logout_redirect_uris']).where('id', '=', row.id).executeTakeFirstOrThrow();
    expect(changed).toEqual({ redirect_uris: ['https://app.example.com/cb'], post_logout_redirect_uris: ['https://app.example.com/after-logout'] });

    // Narrowing the scopes asks first; the confirmation carries the edited list on.
    await userGrant(w, { ...org, publicApp: { ...org.publicApp, client_id: row.client_id } }, w.users.member.id, ['contacts.read', 'tasks.read']);
    const narrowed = { ...fields, post_logout_redirect_uris: 'https://app.example.com/one\nhttps://app.example.com/two', scopes: ['contacts.read'] };
    const ask = await submit(w.browsers.owner, `/dashboard/applications/${row.client_id}`, narrowed);
    expect(ask.body).toContain('>Save and revoke</button>');
    expect(ask.body).toContain('<input type="hidden" name="post_logout_redirect_uris" value="https://app.example.com/one\nhttps://app.example.com/two">');
    expect((await submit(w.browsers.owner, `/dashboard/applications/${row.client_id}`, { ...narrowed, confirm: 'revoke' })).statusCode).toBe(303);
    // The revocation is a job; once it has run, no grant is beyond the scopes and nothing more is asked.
    await finishJobs(w.db);
    expect((await w.db.selectFrom('applications').select('post_logout_redirect_uris').where('id', '=', row.id).executeTakeFirstOrThrow()).post_logout_redirect_uris).toEqual([
      'https://app.example.com/one',
      'https://app.example.com/two',
    ]);

    // An empty field clears them; the page then says so.
    expect((await submit(w.browsers.owner, `/dashboard/applications/${row.client_id}`, { ...narrowed, post_logout_redirect_uris: '' })).statusCode).toBe(303);
    expect((await w.db.selectFrom('applications').select('post_logout_redirect_uris').where('id', '=', row.id).executeTakeFirstOrThrow()).post_logout_redirect_uris).toEqual([]);
    expect((await w.browsers.owner.get(`/dashboard/applications/${row.client_id}`)).body).toContain('<dt>Post-logout redirect URIs</dt><dd>None</dd>');
    // A private application's page and forms have none.
    const backend = (await w.browsers.owner.get(`/dashboard/applications/${org.privateApp.client_id}`)).body;
    expect(backend).not.toMatch(/Post-logout|post_logout_redirect_uris/);
  });

  it('shows the problems of bad post-logout redirect URIs as it shows those of redirect URIs, and changes nothing', async () => {
    const org = await newOrganization(w);
    const many = Array.from({ length: 21 }, (_, i) => `https://app.example.com/bye/${i}`).join('\n');
    const bad = 'http://evil.example.com/bye\nhttps://ok.example.com/bye#frag\n/relative\nhttps://ok.example.com/b\u0007ye';
    const res = await submit(w.browsers.owner, '/dashboard/applications', {
      type: 'public', name: 'Bad', redirect_uris: 'https://ok.example.com/cb', post_logout_redirect_uris: bad, scopes: ['contacts.read'],
    });
    expect(res.statusCode).toBe(400);
    for (const problem of [
      'Post-logout redirect URI http://evil.example.com/bye http is allowed only for loopback hosts',
      'Post-logout redirect URI https://ok.example.com/bye#frag must not contain a fragment.',
      'Post-logout redirect URI /relative must be an absolute URL.',
      'must not contain spaces or control characters.',
    ]) {
      expect(res.body).toContain(problem);
    }
    // The form comes back as it was sent.
    expect(res.body).toContain('http://evil.example.com/bye\nhttps://ok.example.com/bye#frag\n/relative');
    const tooMany = await submit(w.browsers.owner, '/dashboard/applications', {
      type: 'public', name: 'Many', redirect_uris: 'https://ok.example.com/cb', post_logout_redirect_uris: many, scopes: ['contacts.read'],
    });
    expect(tooMany.statusCode).toBe(400);
    expect(tooMany.body).toContain('Enter at most 20 post-logout redirect URIs.');
    expect(await w.db.selectFrom('applications').select('id').where('organization_id', '=', org.id).execute()).toHaveLength(2);

    const edit = await submit(w.browsers.owner, `/dashboard/applications/${org.publicApp.client_id}`, {
      name: 'Web', redirect_uris: 'https://client.example.com/cb', post_logout_redirect_uris: 'http://client.example.com/bye', scopes: ['contacts.read', 'contacts.write', 'tasks.read'],
    });
    expect(edit.statusCode).toBe(400);
    expect(edit.body).toContain('Post-logout redirect URI http://client.example.com/bye http is allowed only for loopback hosts');
    expect(edit.body).toContain('<textarea name="post_logout_redirect_uris" rows="2">http://client.example.com/bye</textarea>');
    const tooManyEdit = await submit(w.browsers.owner, `/dashboard/applications/${org.publicApp.client_id}`, {
      name: 'Web', redirect_uris: 'https://client.example.com/cb', post_logout_redirect_uris: many, scopes: ['contacts.read', 'contacts.write', 'tasks.read'],
    });
    expect(tooManyEdit.statusCode).toBe(400);
    expect(tooManyEdit.body).toContain('Enter at most 20 post-logout redirect URIs.');
    expect((await w.db.selectFrom('applications').select('post_logout_redirect_uris').where('client_id', '=', org.publicApp.client_id).executeTakeFirstOrThrow()).post_logout_redirect_uris).toEqual([]);
    // A private application's form has no such field, and one sent anyway is ignored, as redirect URIs are.
    const backend = await submit(w.browsers.owner, '/dashboard/applications', { type: 'private', name: 'Cron', post_logout_redirect_uris: 'https://app.example.com/bye', scopes: ['tasks.read'] });
    expect(backend.statusCode).toBe(201);
    expect((await w.db.selectFrom('applications').select('post_logout_redirect_uris').where('organization_id', '=', org.id).where('name', '=', 'Cron').executeTakeFirstOrThrow()).post_logout_redirect_uris).toEqual([]);
  });

  it('narrowing scopes asks for confirmation, then revokes only the grants holding a removed scope', async () => {
    const org = await newOrganization(w);
    const narrow = await userGrant(w, org, w.users.member.id, ['contacts.read']);
    const wide = await userGrant(w, org, w.users.owner.id, ['contacts.read', 'contacts.write']);
    const fields = { name: 'Web', redirect_uris: 'https://client.example.com/cb', scopes: ['contacts.read', 'tasks.read'] };
    const ask = await submit(w.browsers.admin, `/dashboard/applications/${org.publicApp.client_id}`, fields);
    expect(ask.statusCode).toBe(200);
    expect(ask.body).toContain('<strong>1</strong> grant that holds it');
    expect(ask.body).toContain('>Save and revoke</button>');
    expect(ask.body).toContain('name="confirm" value="revoke"');
    // Nothing changed before the confirmation.
    expect((await grantRow(w, wide)).revoked_at).toBeNull();
    expect((await w.db.selectFrom('applications').select('scopes').where('client_id', '=', org.publicApp.client_id).executeTakeFirstOrThrow()).scopes).toContain('contacts.write');

    const done = await submit(w.browsers.admin, `/dashboard/applications/${org.publicApp.client_id}`, { ...fields, confirm: 'revoke' });
    expect(done.statusCode).toBe(303);
    await finishJobs(w.db);
    expect(await grantRow(w, wide)).toMatchObject({ revoked_reason: 'scopes_narrowed' });
    expect((await grantRow(w, narrow)).revoked_at).toBeNull();
    expect((await w.db.selectFrom('applications').select('scopes').where('client_id', '=', org.publicApp.client_id).executeTakeFirstOrThrow()).scopes).toEqual([
      'contacts.read',
      'tasks.read',
    ]);
  });

  it('disables an application: every grant is revoked and its token refused at once', async () => {
    const org = await newOrganization(w);
    const token = accessTokenIn((await submit(w.browsers.owner, `/dashboard/applications/${org.privateApp.client_id}/token`, { scopes: ['contacts.read'] })).body) ?? '';
    expect((await listContacts(w.app, org.id, token)).statusCode).toBe(200);
    const other = await userGrant(w, org, w.users.member.id, ['contacts.read']);
    const res = await submit(w.browsers.owner, `/dashboard/applications/${org.privateApp.client_id}/disable`, { confirm: 'disable' });
    expect(res.statusCode).toBe(303);
    expect((await listContacts(w.app, org.id, token)).statusCode).toBe(401);
    await finishJobs(w.db);
    const grants = await w.db
      .selectFrom('grants')
      .innerJoin('applications', 'applications.id', 'grants.application_id')
      .select(['grants.revoked_reason'])
      .where('applications.client_id', '=', org.privateApp.client_id)
      .execute();
    expect(grants).toEqual([{ revoked_reason: 'application_disabled' }]);
    expect((await grantRow(w, other)).revoked_at).toBeNull(); // the public application's grant is untouched
    expect((await clientCredentials(w.app, org.id, org.privateApp.client_id, org.privateApp.client_secret)).statusCode).toBe(401);
    expect(await auditActions(org.id)).toEqual(expect.arrayContaining(['application.disabled', 'grant.revoked']));
  });

  it('deletes an application: gone at once, its grants revoked by the job, its row a tombstone', async () => {
    const org = await newOrganization(w);
    const token = accessTokenIn((await submit(w.browsers.admin, `/dashboard/applications/${org.privateApp.client_id}/token`, { scopes: ['contacts.read'] })).body) ?? '';
    const res = await submit(w.browsers.admin, `/dashboard/applications/${org.privateApp.client_id}/delete`, { confirm: 'delete' });
    expect(res.statusCode).toBe(303);
    expect(res.headers.location).toBe('/dashboard/applications');
    expect((await listContacts(w.app, org.id, token)).statusCode).toBe(401);
    await finishJobs(w.db);
    const tombstone = await w.db.selectFrom('applications').select(['id', 'disabled', 'deleted_at']).where('client_id', '=', org.privateApp.client_id).executeTakeFirstOrThrow();
    expect(tombstone).toMatchObject({ disabled: true, deleted_at: expect.any(Date) });
    expect(await w.db.selectFrom('grants').select('id').where('application_id', '=', tombstone.id).where('revoked_at', 'is', null).execute()).toEqual([]);
    expect((await w.browsers.admin.get('/dashboard/applications')).body).not.toContain(org.privateApp.client_id);
    expect((await w.browsers.admin.get(`/dashboard/applications/${org.privateApp.client_id}`)).statusCode).toBe(404);
    expect(await auditActions(org.id)).toContain('application.deleted');
  });

  // The actions on one application, each with a valid form.
  const actions: { name: string; path: (clientId: string) => string; fields: Record<string, string | string[]> }[] = [
    { name: 'rotate secret', path: (c) => `/dashboard/applications/${c}/secret`, fields: { confirm: 'rotate' } },
    { name: 'generate token', path: (c) => `/dashboard/applications/${c}/token`, fields: { scopes: ['contacts.read'] } },
    { name: 'edit', path: (c) => `/dashboard/applications/${c}`, fields: { name: 'Changed', scopes: ['tasks.read'], confirm: 'revoke' } },
    { name: 'disable', path: (c) => `/dashboard/applications/${c}/disable`, fields: { confirm: 'disable' } },
    { name: 'delete', path: (c) => `/dashboard/applications/${c}/delete`, fields: { confirm: 'delete' } },
    // Their confirmation pages are guarded as the actions are.
    { name: 'ask to rotate secret', path: (c) => `/dashboard/applications/${c}/secret`, fields: {} },
    { name: 'ask to disable', path: (c) => `/dashboard/applications/${c}/disable`, fields: {} },
    { name: 'ask to delete', path: (c) => `/dashboard/applications/${c}/delete`, fields: {} },
  ];

  async function unchanged(organizationId: number, clientId: string, secret: string) {
    const row = await w.db.selectFrom('applications').select(['name', 'disabled', 'scopes']).where('client_id', '=', clientId).executeTakeFirst();
    expect(row).toEqual({ name: 'Backend', disabled: false, scopes: ['contacts.read', 'tasks.read'] });
    expect((await clientCredentials(w.app, organizationId, clientId, secret)).statusCode).toBe(200);
  }

  it.each(actions)('$name: owner and admin may, a member gets 403 and an outsider 404, and nothing changes', async ({ path, fields }) => {
    const refusals: [RoleName, number][] = [
      ['member', 403],
      ['outsider', 404],
    ];
    const org = await newOrganization(w);
    const before = await w.db.selectFrom('grants').select('id').where('organization_id', '=', org.id).execute();
    for (const [role, status] of refusals) {
      const res = await submit(w.browsers[role], path(org.privateApp.client_id), fields);
      expect(res.statusCode, role).toBe(status);
      expectPageSecurityHeaders(res);
    }
    // The checks above minted no token for client_credentials... only the helper's own calls did.
    await unchanged(org.id, org.privateApp.client_id, org.privateApp.client_secret);
    expect((await w.db.selectFrom('grants').select('id').where('organization_id', '=', org.id).execute()).length).toBe(before.length + 1);
    for (const role of ['owner', 'admin'] as const) {
      const fresh = await newOrganization(w);
      const res = await submit(w.browsers[role], path(fresh.privateApp.client_id), fields);
      expect([200, 303], role).toContain(res.statusCode);
    }
  });

  it.each(actions)('$name: a role that manages applications but lacks one of the application’s scopes gets 403, and nothing changes', async ({ path, fields }) => {
    const org = await newOrganization(w);
    // Manages applications, reads contacts, but not tasks: the Backend application holds tasks.read.
    const role = await createRole(w.db, org.id, { name: 'App managers', permissions: ['applications.write', 'contacts.read'] });
    await changeMemberRole(w.db, { organizationId: org.id, userId: w.users.member.id, role });
    const res = await submit(w.browsers.member, path(org.privateApp.client_id), fields);
    expect(res.statusCode).toBe(403);
    expect(res.body).toContain('tasks.read, which your role does not');
    await unchanged(org.id, org.privateApp.client_id, org.privateApp.client_secret);
    // An application within the role: the same action goes through.
    const within = await createApplication(w.db, { organizationId: org.id, type: 'private', name: 'Reader', scopes: 'contacts.read' });
    expect([200, 303]).toContain((await submit(w.browsers.member, path(within.client_id), { ...fields, scopes: ['contacts.read'] })).statusCode);
  });

  it.each(actions)('$name: CSRF token missing or of another session is refused with 403', async ({ path, fields }) => {
    const org = await newOrganization(w);
    const b = w.browsers.owner;
    expect((await b.post(path(org.privateApp.client_id), fields)).statusCode).toBe(403);
    const foreign = await w.browsers.admin.csrf('/dashboard');
    expect((await b.post(path(org.privateApp.client_id), { ...fields, csrf_token: foreign })).statusCode).toBe(403);
    await unchanged(org.id, org.privateApp.client_id, org.privateApp.client_secret);
  });

  it.each(actions)('$name: an owner of two organizations cannot reach the other one by client_id while one is selected', async ({ path, fields }) => {
    const b = await newOrganization(w);
    const a = await newOrganization(w); // selected last: A is current
    const res = await submit(w.browsers.owner, path(b.privateApp.client_id), fields);
    expect(res.statusCode).toBe(404);
    await unchanged(b.id, b.privateApp.client_id, b.privateApp.client_secret);
    expect((await w.browsers.owner.get(`/dashboard/applications/${b.privateApp.client_id}`)).statusCode).toBe(404);
    expect((await w.browsers.owner.get(`/dashboard/applications/${a.privateApp.client_id}`)).statusCode).toBe(200);
  });
});

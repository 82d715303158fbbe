/** Fixtures for OAuth tests: an organization with a private and a public application. */
import { createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import type { FastifyInstance } from 'fastify';
import type { DB } from '../../src/db/connect.js';
import { createApplication, type ApplicationWithSecret } from '../../src/oauth/models/applications.js';

let n = 0;

export interface OrgFixture {
  organizationId: number;
  organizationName: string;
  ownerId: number;
  privateApp: ApplicationWithSecret;
  publicApp: ApplicationWithSecret;
}

export async function createOrgFixture(db: DB, options: { scopes?: string } = {}): Promise<OrgFixture> {
  const i = ++n;
  const owner = await createUser(db, { email: `owner${i}-${Date.now()}@example.com`, password: 'owner-password-1', name: `Owner ${i}` });
  const org = await createOrganization(db, { name: `Org ${i}`, ownerUserId: owner.id });
  const privateApp = await createApplication(db, { organizationId: org.id, type: 'private', name: `Integration ${i}`, ...(options.scopes ? { scopes: options.scopes } : {}) });
  const publicApp = await createApplication(db, { organizationId: org.id, type: 'public', name: `Web ${i}`, redirectUris: ['https://client.example.com/cb'] });
  return { organizationId: org.id, organizationName: org.name, ownerId: owner.id, privateApp, publicApp };
}

/** RFC 6749 §2.3.1 Basic credentials: each part form-url-encoded, then base64. */
export function basic(clientId: string, secret: string): string {
  const enc = (s: string) => encodeURIComponent(s).replace(/%20/g, '+');
  return `Basic ${Buffer.from(`${enc(clientId)}:${enc(secret)}`).toString('base64')}`;
}

export const form = (fields: Record<string, string | string[]>): string => {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(fields)) for (const value of Array.isArray(v) ? v : [v]) params.append(k, value);
  return params.toString();
};

/** RFC 6749 §5.2 / TK-3: error_description uses only %x20-21 / %x23-5B / %x5D-7E. */
export const SAFE_DESCRIPTION = /^[\x20\x21\x23-\x5b\x5d-\x7e]*$/;

/** A client_credentials access token for the fixture's private application (optionally narrowed). */
export async function clientCredentialsToken(app: FastifyInstance, fixture: OrgFixture, scope?: string): Promise<string> {
  const res = await app.inject({
    method: 'POST',
    url: '/oauth/token',
    headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(fixture.privateApp.client_id, fixture.privateApp.client_secret) },
    payload: form({ grant_type: 'client_credentials', organization_id: String(fixture.organizationId), ...(scope ? { scope } : {}) }),
  });
  if (res.statusCode !== 200) throw new Error(`client_credentials failed: ${res.statusCode} ${res.body}`);
  return res.json().access_token;
}

/** Revokes a token of the fixture's private application through /oauth/revoke; returns the status. */
export async function revokeToken(app: FastifyInstance, fixture: OrgFixture, token: string): Promise<number> {
  const res = await app.inject({
    method: 'POST',
    url: '/oauth/revoke',
    headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(fixture.privateApp.client_id, fixture.privateApp.client_secret) },
    payload: form({ token }),
  });
  return res.statusCode;
}

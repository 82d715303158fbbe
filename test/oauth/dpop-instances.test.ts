/**
 * DPoP across instances (RFC 9449 §11.1) and with server nonces (§8, §9): two app instances on
 * one database (TEST_DATABASE_URL, or one PGlite), DPOP_REQUIRE_NONCE=1. A proof used on one
 * instance is refused on the other, the nonces one hands out are good on the other, and of many
 * copies of one proof sent to both at once exactly one is accepted.
 */
import { createHash, generateKeyPairSync, randomUUID, sign } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { testConfig } from '../helpers/app.js';
import { BACKEND } from '../helpers/db.js';
import { startInstancePair, type InstancePair } from '../helpers/instance-pair.js';
import { basic, createOrgFixture, form, type OrgFixture } from '../helpers/oauth.js';

let pair: InstancePair;
let org: OrgFixture;
const issuer = testConfig().issuer;
const keys = generateKeyPairSync('ec', { namedCurve: 'P-256' });
const jwk = keys.publicKey.export({ format: 'jwk' });

beforeAll(async () => {
  pair = await startInstancePair({ env: { DPOP_REQUIRE_NONCE: '1' } });
  org = await createOrgFixture(pair.t.handle.db);
}, 60_000);

afterAll(async () => {
  await pair?.close();
});

/** A proof signed with node:crypto (raw r||s, as JWS wants). */
function proof(claims: { htm: string; htu: string; token?: string; nonce?: string; jti?: string }): string {
  const header = { typ: 'dpop+jwt', alg: 'ES256', jwk };
  const payload = {
    jti: claims.jti ?? randomUUID(),
    htm: claims.htm,
    htu: claims.htu,
    iat: Math.floor(Date.now() / 1000),
    ...(claims.token ? { ath: createHash('sha256').update(claims.token, 'ascii').digest('base64url') } : {}),
    ...(claims.nonce ? { nonce: claims.nonce } : {}),
  };
  const input = `${Buffer.from(JSON.stringify(header)).toString('base64url')}.${Buffer.from(JSON.stringify(payload)).toString('base64url')}`;
  return `${input}.${sign('sha256', Buffer.from(input), { key: keys.privateKey, dsaEncoding: 'ieee-p1363' }).toString('base64url')}`;
}

const tokenRequest = (app: FastifyInstance, dpop: string) =>
  app.inject({
    method: 'POST',
    url: '/oauth/token',
    headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(org.privateApp.client_id, org.privateApp.client_secret), dpop },
    payload: form({ grant_type: 'client_credentials', organization_id: String(org.organizationId), scope: 'contacts.read' }),
  });

describe(`DPoP across two instances with server nonces on ${BACKEND}`, () => {
  it('asks for a nonce, takes one from either instance, and refuses on one a proof used on the other', async () => {
    const tokenUrl = `${issuer}/oauth/token`;
    // No nonce: 400 use_dpop_nonce with one to use.
    const first = await tokenRequest(pair.app, proof({ htm: 'POST', htu: tokenUrl }));
    expect(first.statusCode).toBe(400);
    expect(first.json()).toMatchObject({ error: 'use_dpop_nonce' });
    const nonce = first.headers['dpop-nonce'] as string;
    expect(nonce).toMatch(/^[0-9a-z]+\.[A-Za-z0-9_-]{22}$/);
    // A made-up nonce: refused the same way.
    expect((await tokenRequest(pair.second, proof({ htm: 'POST', htu: tokenUrl, nonce: `${nonce.split('.')[0]}.${'A'.repeat(22)}` }))).json()).toMatchObject({ error: 'use_dpop_nonce' });
    // The first instance's nonce at the second: a DPoP-bound token, and a fresh nonce with it.
    const issued = await tokenRequest(pair.second, proof({ htm: 'POST', htu: tokenUrl, nonce }));
    expect(issued.statusCode, issued.body).toBe(200);
    expect(issued.json()).toMatchObject({ token_type: 'DPoP' });
    expect(issued.headers['dpop-nonce']).toBeDefined();
    const token = issued.json().access_token as string;

    const path = `/api/v1/${org.organizationId}/contacts`;
    const api = (app: FastifyInstance, dpop: string) => app.inject({ method: 'GET', url: path, headers: { authorization: `DPoP ${token}`, dpop } });
    const used = proof({ htm: 'GET', htu: `${issuer}${path}`, token, nonce });
    const ok = await api(pair.app, used);
    expect(ok.statusCode, ok.body).toBe(200);
    // A nonce with the answer, for the next proof (RFC 9449 §9).
    expect(ok.headers['dpop-nonce']).toBeDefined();
    // The same proof at the other instance: seen.
    const replayed = await api(pair.second, used);
    expect(replayed.statusCode).toBe(401);
    expect(replayed.headers['www-authenticate']).toContain('error="invalid_dpop_proof"');
    // Without a nonce at the API: 401 use_dpop_nonce, with a nonce to use.
    const noNonce = await api(pair.second, proof({ htm: 'GET', htu: `${issuer}${path}`, token }));
    expect(noNonce.statusCode).toBe(401);
    expect(noNonce.headers['www-authenticate']).toContain('error="use_dpop_nonce"');
    const fresh = noNonce.headers['dpop-nonce'] as string;
    expect((await api(pair.second, proof({ htm: 'GET', htu: `${issuer}${path}`, token, nonce: fresh }))).statusCode).toBe(200);
  });

  it('accepts exactly one of 40 copies of one proof sent to both instances at once', async () => {
    const tokenUrl = `${issuer}/oauth/token`;
    const nonce = (await tokenRequest(pair.app, proof({ htm: 'POST', htu: tokenUrl }))).headers['dpop-nonce'] as string;
    const token = (await tokenRequest(pair.app, proof({ htm: 'POST', htu: tokenUrl, nonce }))).json().access_token as string;
    const path = `/api/v1/${org.organizationId}/contacts`;
    const copy = proof({ htm: 'GET', htu: `${issuer}${path}`, token, nonce });
    const answers = await Promise.all(
      Array.from({ length: 40 }, (_, i) => (i % 2 === 0 ? pair.app : pair.second).inject({ method: 'GET', url: path, headers: { authorization: `DPoP ${token}`, dpop: copy } })),
    );
    expect(answers.map((a) => a.statusCode).sort()).toEqual([200, ...Array<number>(39).fill(401)]);
  });
});

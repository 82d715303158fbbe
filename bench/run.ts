/**
 * npm run bench [-- --quick]: load benchmark against real PostgreSQL, reported as ratios to
 * baseline routes served by the same process, because absolute numbers on a shared 2-core
 * machine mean little.
 *
 * A template database with the bulk data (an organization of 10,000 contacts and one of
 * 1,000,000) is built once and kept, marked with the seed version; a second one adds the volume
 * of a long-lived deployment to the small organization (1,000,000 live grants, 1,000,000 grants
 * revoked within the access-token lifetime, 5,000,000 refresh tokens). Each run clones both into
 * fresh databases, adds applications and distinct pre-issued refresh tokens and codes, starts
 * bench/server.ts on each, and drops its databases at the end. The token scenarios on the large
 * database are measured against the same scenarios on the small one.
 *
 * The peer: node-oidc-provider (bench/peer-oidc-provider.ts) in a process of its own, its
 * client_credentials grant measured in interleaved rounds against orgauth's with the same load
 * generator settings.
 *
 * The SCIM rows (issue 43, `scimRows`) come last but for the disable row, on PostgreSQL and
 * on PGlite, each in a database and on a server of their own: provisioning through POST
 * /Users, and list pages of filters at 100,000 users (`--only SCIM` runs them alone, without the templates).
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { createHash, createPublicKey, generateKeyPairSync, type KeyObject, randomUUID, sign as cryptoSign } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import autocannon from 'autocannon';
import { sql } from 'kysely';
import pg from 'pg';
import { createOrganization } from '../src/accounts/organizations.js';
import { createUser } from '../src/accounts/users.js';
import { createDirectory } from '../src/directory/directories.js';
import { MAX_COUNT } from '../src/directory/listing.js';
import { createSession } from '../src/accounts/sessions.js';
import { ACTIVITY_METRICS } from '../src/activity.js';
import type { DatabaseTarget } from '../src/config.js';
import { connectDatabase, type DB } from '../src/db/connect.js';
import { migrateToLatest } from '../src/db/migrate.js';
import { generateSecret, sha256Hex } from '../src/lib/crypto.js';
import { createApplication, updateApplication } from '../src/oauth/models/applications.js';
import type { DeveloperApplication } from '../src/db/schema.js';
import { dpopThumbprint } from '../src/oauth/helpers/dpop.js';
import { CLIENT_ASSERTION_TYPE } from '../src/oauth/helpers/client-assertion.js';
import { signAccessToken } from '../src/oauth/models/access-tokens.js';
import { apiResource, apiResourceUri, updateResource } from '../src/oauth/models/resources.js';
import { registerResource } from '../src/oauth/models/resource-clients.js';
import { encodeCursor } from '../src/api/pagination.js';
import { KeyStore } from '../src/oauth/models/key-store.js';
import { ensureSigningKey } from '../src/oauth/models/signing-keys.js';
import { issueClientToken } from '../src/oauth/grants/token-response.js';
import { ClientGrants } from '../src/oauth/models/client-grants.js';
import { findPgBouncer, type PgBouncer, startPgBouncer } from '../test/helpers/pgbouncer.js';
import { freePort } from '../test/helpers/process.js';
import { SERVER_STATEMENT_TIMEOUT_MS } from '../src/db/pooler.js';
import { type HarnessResult, independentHarness, median, startProductionServer } from './harness.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const QUICK = process.argv.includes('--quick');
/** `--only <text>`: run just the scenarios whose name contains text (for profiling one path). */
const ONLY = process.argv.includes('--only') ? process.argv[process.argv.indexOf('--only') + 1] : undefined;
const ADMIN_URL = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const SECRET_KEY = 'bench-secret-key-0123456789-abcdefghijklmnop';
const SEED_VERSION = 'contacts-10k-1m-v1';
const TEMPLATE = 'orgauth_bench_template';
/** The volume of a long-lived deployment (--quick: a hundredth, in a template of its own). */
const BULK = QUICK ? { live: 10_000, revoked: 10_000, refresh: 50_000 } : { live: 1_000_000, revoked: 1_000_000, refresh: 5_000_000 };
const LARGE_SEED = `grants-${BULK.live}-revoked-${BULK.revoked}-refresh-${BULK.refresh}-v1`;
const LARGE_TEMPLATE = `orgauth_bench_template_large${QUICK ? '_quick' : ''}`;
/** Audit events of the large database's small organization (the Overview row); added to the large template once. */
const AUDIT_VOLUME = QUICK ? 10_000 : 1_000_000;
const AUDIT_SEED = `audit-${AUDIT_VOLUME}-v1`;
const PEER_CLIENT_ID = 'bench-peer';
const PEER_CLIENT_SECRET = 'bench-peer-secret-0123456789abcdefghijklmnop';
const CONNECTIONS = 50;
// --quick is CI's check that every row still runs (no thresholds): one round, no warm-up, and each
// round a fixed number of requests rather than autocannon's shortest duration (it counts whole
// seconds: two 1 s rounds per row were most of the run).
const QUICK_REQUESTS_PER_CONNECTION = 4;
const WARMUP_S = QUICK ? 0 : 3;
const ROUND_S = QUICK ? 1 : 8;
/** `--rounds N`: more interleaved rounds for a steadier median on a noisy machine (default 3; --quick 1). */
const ROUNDS_ARG = process.argv.includes('--rounds') ? Number(process.argv[process.argv.indexOf('--rounds') + 1]) : undefined;
if (ROUNDS_ARG !== undefined && !(Number.isInteger(ROUNDS_ARG) && ROUNDS_ARG >= 1 && ROUNDS_ARG <= 50)) throw new Error('--rounds takes a whole number from 1 to 50');
const ROUNDS = ROUNDS_ARG ?? (QUICK ? 1 : 3);
/** Distinct refresh tokens and codes per scenario: more than the run can use. */
const PRE_ISSUED = QUICK ? 5_000 : 200_000;
const REDIRECT = 'https://bench.example.com/cb';

const dbUrl = (name: string) => {
  const url = new URL(ADMIN_URL);
  url.pathname = `/${name}`;
  return url.toString();
};

async function admin<T>(fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: ADMIN_URL });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

/**
 * A template kept from an earlier run: its schema brought up to date once (index builds over
 * millions of rows), rather than in every run's clone; and vacuumed, as autovacuum keeps a
 * production database (a template built before the build vacuumed was not: its index-only
 * scans visited the table for every row, and a start-up with a million revoked grants took
 * 4.1–4.4 s instead of 2.6–2.7 s). Quick when it already is: pages all-visible are skipped.
 */
async function migrateInPlace(template: string): Promise<void> {
  const handle = await connectDatabase({ kind: 'postgres', url: dbUrl(template) }, { queryTimeoutMs: 3_600_000 });
  try {
    const applied = await migrateToLatest(handle.db);
    if (applied.length > 0) console.log(`migrated ${template}: ${applied.join(', ')}`);
    await sql`vacuum`.execute(handle.db);
  } finally {
    await handle.close();
  }
}

/** The bulk data, built once per machine and reused while its marker matches. */
async function ensureTemplate(): Promise<void> {
  const marker = await admin(async (c) => {
    const exists = await c.query('select 1 from pg_database where datname = $1', [TEMPLATE]);
    if (exists.rowCount === 0) return undefined;
    const t = new pg.Client({ connectionString: dbUrl(TEMPLATE) });
    await t.connect();
    try {
      const r = await t.query<{ version: string }>('select version from bench_marker').catch(() => ({ rows: [] as { version: string }[] }));
      return r.rows[0]?.version;
    } finally {
      await t.end();
    }
  });
  if (marker === SEED_VERSION) {
    await migrateInPlace(TEMPLATE);
    return;
  }
  console.log(`building the bench template database ${TEMPLATE} (once): 1,010,000 contacts...`);
  await admin(async (c) => {
    await c.query(`drop database if exists ${TEMPLATE} with (force)`);
    await c.query(`create database ${TEMPLATE}`);
  });
  const handle = await connectDatabase({ kind: 'postgres', url: dbUrl(TEMPLATE) }, { queryTimeoutMs: 3_600_000 });
  try {
    await migrateToLatest(handle.db);
    const db = handle.db;
    const [small, big] = await db.insertInto('organizations').values([{ name: 'Small Org' }, { name: 'Big Org' }]).returning('id').execute();
    await sql`insert into contacts (organization_id, name, email, company)
      select ${small!.id}, 'Contact ' || g, 'contact' || g || '@example.com', 'Company ' || (g % 100) from generate_series(1, 10000) g`.execute(db);
    await sql`insert into contacts (organization_id, name, email, company)
      select ${big!.id}, 'Contact ' || g, 'contact' || g || '@example.com', 'Company ' || (g % 100) from generate_series(1, 1000000) g`.execute(db);
    await sql`create table bench_marker (version text not null, small_org bigint not null, big_org bigint not null)`.execute(db);
    await sql`insert into bench_marker values (${SEED_VERSION}, ${small!.id}, ${big!.id})`.execute(db);
    await sql`analyze`.execute(db);
  } finally {
    await handle.close();
  }
}

/**
 * The small template plus, in its small organization, the volume of a long-lived deployment:
 * live grants of a public application, grants revoked over the last day (every instance loads
 * these: they are within the access-token lifetime) and refresh tokens spread over the live grants.
 */
async function ensureLargeTemplate(): Promise<void> {
  const marker = await admin(async (c) => {
    if ((await c.query('select 1 from pg_database where datname = $1', [LARGE_TEMPLATE])).rowCount === 0) return undefined;
    const t = new pg.Client({ connectionString: dbUrl(LARGE_TEMPLATE) });
    await t.connect();
    try {
      return (await t.query<{ version: string }>('select version from bench_large_marker').catch(() => ({ rows: [] as { version: string }[] }))).rows[0]?.version;
    } finally {
      await t.end();
    }
  });
  if (marker === LARGE_SEED) {
    await migrateInPlace(LARGE_TEMPLATE);
    return;
  }
  console.log(`building the bench template database ${LARGE_TEMPLATE} (once): ${BULK.live} live and ${BULK.revoked} revoked grants, ${BULK.refresh} refresh tokens...`);
  await admin(async (c) => {
    await c.query(`drop database if exists ${LARGE_TEMPLATE} with (force)`);
    await c.query(`create database ${LARGE_TEMPLATE} template ${TEMPLATE}`);
  });
  const handle = await connectDatabase({ kind: 'postgres', url: dbUrl(LARGE_TEMPLATE) }, { queryTimeoutMs: 3_600_000 });
  try {
    const db = handle.db;
    const { rows } = await sql<{ small_org: number }>`select small_org from bench_marker`.execute(db);
    const org = Number(rows[0]!.small_org);
    const user = await createUser(db, { email: 'bulk@example.com', password: 'bulk-password-1' });
    const app = await createApplication(db, { organizationId: org, type: 'public', name: 'Bulk Web', redirectUris: [REDIRECT] });
    const appId = (await db.selectFrom('applications').select('id').where('client_id', '=', app.client_id).executeTakeFirstOrThrow()).id;
    await sql`insert into grants (organization_id, application_id, user_id, scopes)
      select ${org}, ${appId}, ${user.id}, '{contacts.read}' from generate_series(1, ${BULK.live})`.execute(db);
    // One statement's identity values are consecutive: the live grants are first .. first + live - 1.
    const { rows: first } = await sql<{ id: number }>`select min(id) as id from grants where application_id = ${appId}`.execute(db);
    await sql`insert into grants (organization_id, application_id, user_id, scopes, revoked_at, revoked_reason)
      select ${org}, ${appId}, ${user.id}, '{contacts.read}', now() - (g % 86400) * interval '1 second', 'revoked_by_user'
      from generate_series(1, ${BULK.revoked}) g`.execute(db);
    await sql`insert into refresh_tokens (token_hash, organization_id, grant_id, scopes, expires_at)
      select encode(sha256(convert_to('bulk refresh ' || g, 'UTF8')), 'hex'), ${org}, ${first[0]!.id} + g % ${BULK.live}, '{contacts.read}', now() + interval '30 days'
      from generate_series(1, ${BULK.refresh}) g`.execute(db);
    // As autovacuum leaves a production database: index-only scans that need not visit the table.
    await sql`vacuum (analyze)`.execute(db);
    await sql`create table bench_large_marker (version text not null)`.execute(db);
    await sql`insert into bench_large_marker values (${LARGE_SEED})`.execute(db);
  } finally {
    await handle.close();
  }
}

/**
 * The large template's small organization also holds AUDIT_VOLUME audit events, spread over the
 * last 30 days (added to an existing template without rebuilding it; its own marker).
 */
async function ensureAuditVolume(): Promise<void> {
  const t = new pg.Client({ connectionString: dbUrl(LARGE_TEMPLATE) });
  await t.connect();
  try {
    const marker = (await t.query<{ version: string }>('select version from bench_audit_marker').catch(() => ({ rows: [] as { version: string }[] }))).rows[0]?.version;
    if (marker === AUDIT_SEED) return;
    console.log(`adding ${AUDIT_VOLUME.toLocaleString('en')} audit events to ${LARGE_TEMPLATE} (once)...`);
    const org = Number((await t.query<{ small_org: string }>('select small_org from bench_marker')).rows[0]!.small_org);
    await t.query('begin');
    await t.query('drop table if exists bench_audit_marker');
    await t.query('delete from audit_events where organization_id = $1', [org]);
    await t.query(
      `insert into audit_events (organization_id, action, actor_client_id, details, created_at)
       select $1, 'grant.revoked', 'bench-bulk', jsonb_build_object('grant_id', g), now() - (g % 2592000) * interval '1 second'
       from generate_series(1, $2::int) g`,
      [org, AUDIT_VOLUME],
    );
    await t.query('create table bench_audit_marker (version text not null)');
    await t.query('insert into bench_audit_marker values ($1)', [AUDIT_SEED]);
    await t.query('commit');
    await t.query('analyze audit_events');
  } finally {
    await t.end();
  }
}

interface Fixture {
  smallOrg: number;
  bigOrg: number;
  privateBasic: string;
  publicBasic: string;
  smallToken: string;
  bigToken: string;
  deepCursor: string;
  refreshTokens: string[];
  codes: string[];
  /** A DPoP key, and the small organization's token bound to it (RFC 9449). */
  dpop: { key: KeyObject; jwk: JsonWebKey; token: string };
  /** A private application authenticating with private_key_jwt: its client_id, signing key and kid. */
  keyClient: { clientId: string; key: KeyObject; kid: string };
  /** Token exchange (RFC 8693): resource A's Basic credentials, a user's token for A, and B, which allows A. */
  exchange: { basic: string; subjectToken: string; target: string };
}

/** A compact ES256 JWS over `header` and `payload` with node:crypto (the load generator shares the machine: cheap signatures). */
function es256(header: object, payload: object, key: KeyObject): string {
  const input = `${Buffer.from(JSON.stringify(header)).toString('base64url')}.${Buffer.from(JSON.stringify(payload)).toString('base64url')}`;
  return `${input}.${cryptoSign('sha256', Buffer.from(input), { key, dsaEncoding: 'ieee-p1363' }).toString('base64url')}`;
}

/** A fresh DPoP proof for `method` `url` (and the token's hash, at a resource). */
function dpopProof(f: Fixture, method: string, url: string, token?: string): string {
  const ath = token === undefined ? {} : { ath: createHash('sha256').update(token, 'ascii').digest('base64url') };
  return es256({ typ: 'dpop+jwt', alg: 'ES256', jwk: f.dpop.jwk }, { jti: randomUUID(), htm: method, htu: url, iat: Math.floor(Date.now() / 1000), ...ath }, f.dpop.key);
}

/** A fresh private_key_jwt assertion of the fixture's key client (or `clientId`, with the same key) for `issuer`. */
function clientAssertion(f: Fixture, issuer: string, clientId = f.keyClient.clientId): string {
  const iat = Math.floor(Date.now() / 1000);
  const { key, kid } = f.keyClient;
  return es256({ alg: 'ES256', kid, typ: 'JWT' }, { iss: clientId, sub: clientId, aud: issuer, jti: randomUUID(), iat, exp: iat + 60 }, key);
}

/** Per run: applications, a token for the API scenarios, and distinct refresh tokens and codes. */
async function seedRun(db: DB, port: number): Promise<Fixture> {
  const { rows } = await sql<{ small_org: number; big_org: number }>`select small_org, big_org from bench_marker`.execute(db);
  const smallOrg = Number(rows[0]!.small_org);
  const bigOrg = Number(rows[0]!.big_org);
  const user = await createUser(db, { email: 'bench@example.com', password: 'bench-password-1' });
  await sql`insert into memberships (organization_id, user_id, role) values (${smallOrg}, ${user.id}, 'owner'), (${bigOrg}, ${user.id}, 'owner')`.execute(db);
  const owned = await createOrganization(db, { name: 'Bench Developer', ownerUserId: user.id });
  const priv = await createApplication(db, { organizationId: smallOrg, type: 'private', name: 'Bench Integration' });
  const privBig = await createApplication(db, { organizationId: bigOrg, type: 'private', name: 'Bench Integration Big' });
  const pub = await createApplication(db, { organizationId: owned.id, type: 'public', name: 'Bench Web', redirectUris: [REDIRECT] });
  const pubApp = await db.selectFrom('applications').select('id').where('client_id', '=', pub.client_id).executeTakeFirstOrThrow();
  await ensureSigningKey(db, { alg: 'ES256', secretKey: SECRET_KEY });
  const keys = new KeyStore(db, { secretKey: SECRET_KEY, accessTokenTtl: 3600, signingAlg: 'ES256' });
  const ctx = { db, keys, config: { issuer: `http://127.0.0.1:${port}`, accessTokenTtl: 3600 }, clientGrants: new ClientGrants(db) };
  const privRow = await db.selectFrom('applications').selectAll().where('client_id', '=', priv.client_id).executeTakeFirstOrThrow();
  const bigRow = await db.selectFrom('applications').selectAll().where('client_id', '=', privBig.client_id).executeTakeFirstOrThrow();
  const accessToken = (await issueClientToken(ctx, privRow, ['contacts.read'])).access_token;
  // DPoP: a key, and a token bound to it.
  const dpopKeys = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const dpopJwk = dpopKeys.publicKey.export({ format: 'jwk' });
  const dpopToken = (await issueClientToken(ctx, privRow, ['contacts.read'], apiResource(ctx.config), dpopThumbprint(dpopJwk))).access_token;
  // private_key_jwt: a private application with a registered public key.
  const keyed = await createApplication(db, { organizationId: smallOrg, type: 'private', name: 'Bench Keys' });
  const clientKeys = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const kid = 'bench-key-1';
  const keyedRow = (await db.selectFrom('applications').selectAll().where('client_id', '=', keyed.client_id).executeTakeFirstOrThrow()) as DeveloperApplication;
  await updateApplication(db, keyedRow, { tokenEndpointAuthMethod: 'private_key_jwt', jwks: { keys: [{ ...clientKeys.publicKey.export({ format: 'jwk' }), kid, alg: 'ES256', use: 'sig' }] } });
  const bigToken = (await issueClientToken(ctx, bigRow, ['contacts.read'])).access_token;
  // Token exchange: resource A (with its credentials) exchanges the bench user's token for A for one to B, which allows A.
  const exchangeA = await registerResource(db, ctx.config, { uri: 'https://a.bench.example', name: 'Bench A', scopes: 'orders.read' });
  await registerResource(db, ctx.config, { uri: 'https://b.bench.example', name: 'Bench B', scopes: 'orders.read' });
  await updateResource(db, 'https://b.bench.example', { allowExchangeFrom: ['https://a.bench.example'] });
  // The user's grant to the public application for A, as the other pre-issued grants are made.
  const subjectGrant = await db
    .insertInto('grants')
    .values({ organization_id: smallOrg, application_id: pubApp.id, user_id: user.id, scopes: ['orders.read'], resource_id: exchangeA.resource.id })
    .returning('id')
    .executeTakeFirstOrThrow();
  const { token: subjectToken } = await signAccessToken(await keys.signingKey(), ctx.config, {
    subject: String(user.id),
    clientId: pub.client_id,
    scopes: ['orders.read'],
    organizationId: smallOrg,
    grantId: subjectGrant.id,
    resource: { uri: 'https://a.bench.example', accessTokenTtl: 3600 },
  });

  // Page 40,000 of 25 in the big organization starts after its 999,975th contact.
  const { rows: deep } = await sql<{ id: number }>`select id from contacts where organization_id = ${bigOrg} order by id offset 999974 limit 1`.execute(db);

  const refreshTokens: string[] = [];
  const codes: string[] = [];
  const expires = sql<Date>`now() + interval '1 day'`;
  for (let start = 0; start < PRE_ISSUED; start += 2000) {
    const n = Math.min(2000, PRE_ISSUED - start);
    const grants = await db
      .insertInto('grants')
      .values(Array.from({ length: n }, () => ({ organization_id: smallOrg, application_id: pubApp.id, user_id: user.id, scopes: ['contacts.read'] })))
      .returning('id')
      .execute();
    const batch = grants.map((g) => ({ grant: g.id, token: generateSecret(32) }));
    await db
      .insertInto('refresh_tokens')
      .values(batch.map((b) => ({ token_hash: sha256Hex(b.token), organization_id: smallOrg, grant_id: b.grant, scopes: ['contacts.read'], expires_at: expires })))
      .execute();
    refreshTokens.push(...batch.map((b) => b.token));
    const codeBatch = Array.from({ length: n }, () => generateSecret(32));
    await db
      .insertInto('authorization_codes')
      .values(
        codeBatch.map((code) => ({
          code_hash: sha256Hex(code), organization_id: smallOrg, application_id: pubApp.id, user_id: user.id, redirect_uri: REDIRECT,
          scopes: ['contacts.read'], code_challenge: null, code_challenge_method: null, expires_at: expires,
        })),
      )
      .execute();
    codes.push(...codeBatch);
  }
  return {
    smallOrg,
    bigOrg,
    privateBasic: basic(priv.client_id, priv.client_secret),
    publicBasic: basic(pub.client_id, pub.client_secret),
    smallToken: accessToken,
    bigToken,
    deepCursor: encodeCursor(deep[0]!.id),
    refreshTokens,
    codes,
    dpop: { key: dpopKeys.privateKey, jwk: dpopJwk, token: dpopToken },
    keyClient: { clientId: keyed.client_id, key: clientKeys.privateKey, kid },
    exchange: { basic: basic(exchangeA.credentials.client_id, exchangeA.credentials.client_secret), subjectToken, target: 'https://b.bench.example' },
  };
}

/**
 * The Overview row: on the large database, two sessions of the bench user (owner of both
 * organizations), one whose current organization is the small one (BULK.live live grants,
 * BULK.revoked revoked, AUDIT_VOLUME audit events, 30 days of activity counters) and one on a
 * new organization with nothing but the same activity counters. The session cookie is the session id (src/accounts/sessions.ts).
 */
async function seedOverview(db: DB): Promise<{ full: string; empty: string; counts: { grants: number; audit: number } }> {
  const { rows } = await sql<{ small_org: number }>`select small_org from bench_marker`.execute(db);
  const org = Number(rows[0]!.small_org);
  const user = await db.selectFrom('users').select('id').where('email', '=', 'bench@example.com').executeTakeFirstOrThrow();
  const empty = await createOrganization(db, { name: 'Overview Empty', ownerUserId: user.id });
  // Both have the same 30 days of activity counters (a fixed-size read and the same charts to
  // draw): what differs is the volume of grants and audit events only.
  for (const id of [org, empty.id]) {
    await sql`insert into activity_daily (organization_id, metric, day, count)
      select ${id}, m, current_date - d, 1 + (d * 7 + length(m)) % 50
      from unnest(${[...ACTIVITY_METRICS]}::text[]) m, generate_series(0, 29) d`.execute(db);
  }
  const full = await createSession(db, user.id, { currentOrganizationId: org });
  const none = await createSession(db, user.id, { currentOrganizationId: empty.id });
  const grants = Number((await sql<{ n: number }>`select count(*) as n from grants where organization_id = ${org} and revoked_at is null`.execute(db)).rows[0]!.n);
  const audit = Number((await sql<{ n: number }>`select count(*) as n from audit_events where organization_id = ${org}`.execute(db)).rows[0]!.n);
  return { full, empty: none, counts: { grants, audit } };
}

/** What the application-disabling scenario needs on the large database: the bulk application, a management token, a token of the bulk application. */
interface DisableFixture {
  org: number;
  bulkClientId: string;
  bulkAppId: number;
  managementToken: string;
  bulkAccessToken: string;
}

/**
 * On the large database: an access token of the bulk public application (BULK.live live
 * grants), for one of its grants, signed as the token endpoint would; and a private application
 * that may administer applications, with a token.
 */
async function seedDisable(db: DB, port: number): Promise<DisableFixture> {
  const { rows } = await sql<{ small_org: number }>`select small_org from bench_marker`.execute(db);
  const org = Number(rows[0]!.small_org);
  const bulk = await db.selectFrom('applications').selectAll().where('name', '=', 'Bulk Web').where('organization_id', '=', org).executeTakeFirstOrThrow();
  const grant = await db.selectFrom('grants').select(['id', 'user_id']).where('application_id', '=', bulk.id).where('revoked_at', 'is', null).limit(1).executeTakeFirstOrThrow();
  // It may change only an application whose scopes its token holds (management API rule).
  const adminScopes = ['applications.read', 'applications.write', 'contacts.read', 'contacts.write', 'tasks.read', 'tasks.write'];
  const admin = await createApplication(db, { organizationId: org, type: 'private', name: 'Bench Administrator', scopes: adminScopes.join(' ') });
  const adminRow = await db.selectFrom('applications').selectAll().where('client_id', '=', admin.client_id).executeTakeFirstOrThrow();
  const keys = new KeyStore(db, { secretKey: SECRET_KEY, accessTokenTtl: 3600, signingAlg: 'ES256' });
  const ctx = { db, keys, config: { issuer: `http://127.0.0.1:${port}`, accessTokenTtl: 3600 }, clientGrants: new ClientGrants(db) };
  const managementToken = (await issueClientToken(ctx, adminRow, adminScopes)).access_token;
  const issuer = { issuer: ctx.config.issuer };
  const { token: bulkAccessToken } = await signAccessToken(await keys.signingKey(), issuer, {
    subject: String(grant.user_id),
    clientId: bulk.client_id,
    scopes: ['contacts.read'],
    organizationId: org,
    grantId: grant.id,
    resource: { uri: apiResourceUri(issuer), accessTokenTtl: 3600 },
  });
  return { org, bulkClientId: bulk.client_id, bulkAppId: bulk.id, managementToken, bulkAccessToken };
}

interface DisableResult {
  grants: number;
  answerMs: number;
  refusedMs: number;
  killedAt: number;
  jobS: number;
  revoked: number;
  revokedOnce: boolean;
  pass: boolean;
}

/**
 * Issue 27: disabling an application holding BULK.live grants. The PATCH must answer within a
 * second, the application's token be refused within a second of that, and the job revoke every
 * grant, each once, although the server running it is SIGKILLed a third of the way through and
 * a new one (after the lease runs out) finishes it.
 */
async function disableAtVolume(database: string, port: number, f: DisableFixture, server: ChildProcess, restart: () => Promise<ChildProcess>): Promise<DisableResult> {
  const client = new pg.Client({ connectionString: dbUrl(database) });
  await client.connect();
  try {
    const token = f.bulkAccessToken;
    const contacts = () => fetch(`http://127.0.0.1:${port}/api/v1/${f.org}/contacts?limit=1`, { headers: { authorization: `Bearer ${token}` } }).then((r) => r.status);
    if ((await contacts()) !== 200) throw new Error('the bulk application token does not work before disabling');
    const live = async () => Number((await client.query('select count(*) as n from grants where application_id = $1 and revoked_at is null', [f.bulkAppId])).rows[0].n);
    const grants = await live();
    const started = performance.now();
    const res = await fetch(`http://127.0.0.1:${port}/api/v1/${f.org}/applications/${f.bulkClientId}`, {
      method: 'PATCH',
      headers: { authorization: `Bearer ${f.managementToken}`, 'content-type': 'application/json' },
      body: JSON.stringify({ disabled: true }),
    });
    const answerMs = performance.now() - started;
    if (res.status !== 200) throw new Error(`disabling: ${res.status} ${await res.text()}`);
    while ((await contacts()) !== 401) await new Promise((r) => setTimeout(r, 10));
    const refusedMs = performance.now() - started - answerMs;
    const job = async () =>
      (await client.query<{ id: string; state: string; progress_done: string }>(`select id, state, progress_done from jobs where kind = 'application.revoke_grants' order by id desc limit 1`)).rows[0];
    let seen = await job();
    while (!seen || Number(seen.progress_done) < grants / 3) {
      if (seen?.state === 'succeeded') throw new Error('the job finished before the server could be killed midway');
      await new Promise((r) => setTimeout(r, 20));
      seen = await job();
    }
    server.kill('SIGKILL');
    const killedAt = Number(seen.progress_done);
    await new Promise((r) => server.once('exit', r));
    // --quick: the dead server's lease is made to run out now rather than in LEASE_S (as the tests
    // do), so the new server claims the job as soon as it starts; the full run waits for it.
    if (QUICK) await client.query(`update jobs set due_at = now() where kind = 'application.revoke_grants' and state = 'running'`);
    await restart();
    while ((await job())?.state !== 'succeeded') await new Promise((r) => setTimeout(r, 200));
    const jobS = (performance.now() - started) / 1000;
    const left = await live();
    const { rows } = await client.query<{ n: string; distinct_n: string }>(
      `select count(*) as n, count(distinct details->>'grant_id') as distinct_n from audit_events where action = 'grant.revoked' and (details->>'application_id')::bigint = $1 and details->>'reason' = 'application_disabled'`,
      [f.bulkAppId],
    );
    const revoked = Number(rows[0]!.n);
    const revokedOnce = revoked === Number(rows[0]!.distinct_n) && revoked === grants;
    return { grants, answerMs, refusedMs, killedAt, jobS, revoked, revokedOnce, pass: left === 0 && revokedOnce && (QUICK || (answerMs < 1000 && refusedMs < 1000)) };
  } finally {
    await client.end();
  }
}

let PORT = 0;

/**
 * The server runs compiled, as in production: under tsx its resident memory was about 80 MB
 * higher (measured idle: 203 MB with tsx, 122 MB for dist/src/server.js).
 */
/** The build and the bench's servers, compiled unless dist/ holds them from the same sources (scripts/build.mjs). */
function buildServer(): void {
  const result = spawnSync(process.execPath, [path.join(ROOT, 'scripts/build.mjs'), 'bench'], { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] });
  if (result.status !== 0) throw new Error('node scripts/build.mjs bench failed');
}

/**
 * `--pgbouncer`: the servers reach PostgreSQL through Debian's PgBouncer in transaction mode
 * (started here on a free port, as test/pgbouncer.test.ts does), LISTEN directly; the runs'
 * databases get the role's statement_timeout the README asks operators for.
 */
const PGBOUNCER = process.argv.includes('--pgbouncer');
let bouncer: PgBouncer | undefined;

/** `database`: a PostgreSQL URL, or the DATA_DIR of a PGlite server (the SCIM rows). */
function startServer(database: string | { dataDir: string }, port: number): Promise<ChildProcess> {
  // BENCH_CPU_PROF=1: the server writes a V8 CPU profile to bench/results/ when it stops.
  const profile = process.env.BENCH_CPU_PROF ? ['--cpu-prof', `--cpu-prof-dir=${path.join(ROOT, 'bench/results')}`] : [];
  // BENCH_NODE_FLAGS: extra node flags for the server, for experiments (e.g. GC settings).
  profile.push(...(process.env.BENCH_NODE_FLAGS?.split(' ').filter(Boolean) ?? []));
  const child = spawn(process.execPath, [...profile, path.join(ROOT, 'dist/bench/server.js')], {
    cwd: ROOT,
    env: {
      PATH: process.env.PATH,
      ...(typeof database !== 'string'
        ? { DATA_DIR: database.dataDir }
        : bouncer
          ? { DATABASE_URL: bouncer.url(new URL(database).pathname.slice(1)), DATABASE_POOLER: 'transaction', DATABASE_LISTEN_URL: database }
          : { DATABASE_URL: database }),
      SECRET_KEY,
      PORT: String(port),
      ISSUER: `http://127.0.0.1:${port}`,
      LOG_LEVEL: 'warn',
      API_RATE_LIMIT: '0',
      SCIM_RATE_LIMIT: '0',
      DATABASE_POOL_MAX: '10',
    },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  return ready(child, 'bench server ready');
}

/**
 * One of the bench's own processes (dist/bench/`file`, compiled like the server and run with the
 * same node, in production mode), once it prints `line`. `stderr`: shown, or not (the peer warns
 * about the Node.js version on every start).
 */
function startBenchProcess(file: string, env: Record<string, string>, line: string, stderr: 'inherit' | 'ignore'): Promise<ChildProcess> {
  const child = spawn(process.execPath, [path.join(ROOT, 'dist/bench', file)], {
    cwd: ROOT,
    env: { PATH: process.env.PATH, NODE_ENV: 'production', ...env },
    stdio: ['ignore', 'pipe', stderr],
  });
  return ready(child, line);
}

/** node-oidc-provider (bench/peer-oidc-provider.ts). */
const startPeer = (port: number, keysJwks: object) =>
  startBenchProcess('peer-oidc-provider.js', { PEER_PORT: String(port), PEER_CLIENT_ID, PEER_CLIENT_SECRET, PEER_KEYS_JWKS: JSON.stringify(keysJwks) }, 'peer ready', 'ignore');

/** The harness's floor (bench/floor-server.ts). */
const startFloor = (port: number, accepted: string) => startBenchProcess('floor-server.js', { FLOOR_PORT: String(port), FLOOR_BASIC: accepted }, 'floor ready', 'inherit');

function ready(child: ChildProcess, line: string): Promise<ChildProcess> {
  return new Promise((resolve, reject) => {
    child.stdout?.on('data', (d: Buffer) => {
      if (d.toString().includes(line)) resolve(child);
    });
    child.once('exit', (code) => reject(new Error(`${line.split(' ')[0]} exited with ${code}`)));
  });
}

/** Peak resident set of the server so far (VmHWM), in MB. */
function peakRssMb(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(/VmHWM:\s+(\d+) kB/.exec(status)?.[1] ?? 0) / 1024;
}

interface Load {
  name: string;
  /** The server's port (default: the small database's server). */
  port?: number;
  method: 'GET' | 'POST';
  path: string;
  headers?: Record<string, string>;
  /** A body per request (distinct tokens), or none. */
  body?: () => string;
  /** Headers made per request (a fresh DPoP proof each), on top of `headers`. */
  headersPerRequest?: () => Record<string, string>;
  /** Run before each measurement of `seconds` (signing the proofs it will send, ahead of time). */
  prepare?: (seconds: number) => void;
  /** Connections of the load generator (default CONNECTIONS). */
  connections?: number;
}

/** Most requests a second a signed scenario is prepared for (more are signed as they are sent). */
const PREPARED_RPS = 6000;

/**
 * Values made ahead of time: what a client signs (DPoP proofs, client assertions) is signed by
 * the client, on its own machine; here the load generator shares the server's two cores, so it
 * signs a round's worth before the round rather than while it is measured. A pool that runs dry
 * makes more as they are asked for. Made just before the round: their iat is fresh.
 */
function prepared(make: () => string): { next: () => string; fill: (seconds: number) => void } {
  let pool: string[] = [];
  return {
    next: () => pool.pop() ?? make(),
    fill: (seconds) => {
      pool = Array.from({ length: Math.ceil(seconds * PREPARED_RPS) }, make);
    },
  };
}

interface Measured {
  rps: number;
  p50: number;
  p99: number;
  non2xx: number;
}

const refusals = new Set<string>();

async function measure(load: Load, seconds: number): Promise<Measured> {
  load.prepare?.(seconds);
  const form = { 'content-type': 'application/x-www-form-urlencoded' };
  const connections = load.connections ?? CONNECTIONS;
  const result = await autocannon({
    url: `http://127.0.0.1:${load.port ?? PORT}`,
    connections,
    pipelining: 1,
    // A round of --quick ends at the first sample after its last answer: sampled every 100 ms.
    ...(QUICK ? { amount: connections * QUICK_REQUESTS_PER_CONNECTION, sampleInt: 100 } : { duration: seconds }),
    requests: [
      {
        method: load.method,
        path: load.path,
        headers: { ...(load.body ? form : {}), ...load.headers },
        ...(load.body || load.headersPerRequest
          ? {
              setupRequest: (req: autocannon.Request) => ({
                ...req,
                ...(load.body ? { body: load.body() } : {}),
                ...(load.headersPerRequest ? { headers: { ...req.headers, ...load.headersPerRequest() } } : {}),
              }),
            }
          : {}),
        // The first refused answer of a run, so a failing scenario says why.
        onResponse: (status: number, body: string) => {
          if ((status < 200 || status > 299) && !refusals.has(load.name)) {
            refusals.add(load.name);
            console.error(`${load.name}: ${status} ${body.slice(0, 300)}`);
          }
        },
      },
    ],
  });
  // A --quick round lasts well under a second: its rate is what it sent over the time it took.
  const rps = QUICK ? result.requests.total / Math.max(result.duration, 0.01) : result.requests.average;
  return { rps, p50: result.latency.p50, p99: result.latency.p99, non2xx: result.non2xx + result.errors + result.timeouts };
}


interface ScenarioResult {
  scenario: string;
  baseline: string;
  metric: 'throughput' | 'p50 latency';
  target: string;
  rounds: { scenario: Measured; baseline: Measured }[];
  ratio: number;
  /** When asked: the medians of the rounds' p99 latencies, the scenario's no worse than the baseline's. */
  p99?: { scenario: number; baseline: number; pass: boolean };
  pass: boolean;
}

async function runScenario(
  scenario: Load,
  baseline: Load,
  metric: 'throughput' | 'p50 latency',
  target: number,
  options: { p99NoWorse?: boolean } = {},
): Promise<ScenarioResult | undefined> {
  if (ONLY !== undefined && !scenario.name.includes(ONLY)) return undefined;
  if (WARMUP_S > 0) {
    await measure(baseline, WARMUP_S);
    await measure(scenario, WARMUP_S);
  }
  const rounds: ScenarioResult['rounds'] = [];
  for (let i = 0; i < ROUNDS; i++) {
    const b = await measure(baseline, ROUND_S);
    const s = await measure(scenario, ROUND_S);
    rounds.push({ scenario: s, baseline: b });
  }
  const ratios = rounds.map((r) => (metric === 'throughput' ? r.scenario.rps / r.baseline.rps : r.scenario.p50 / Math.max(r.baseline.p50, 0.001)));
  const ratio = median(ratios);
  const failedRequests = rounds.some((r) => r.scenario.non2xx > 0 || r.baseline.non2xx > 0);
  const meets = metric === 'throughput' ? ratio >= target : ratio <= target;
  let p99: ScenarioResult['p99'];
  if (options.p99NoWorse) {
    const mine = median(rounds.map((r) => r.scenario.p99));
    const theirs = median(rounds.map((r) => r.baseline.p99));
    p99 = { scenario: mine, baseline: theirs, pass: mine <= theirs };
  }
  return {
    scenario: scenario.name,
    baseline: baseline.name,
    metric,
    target: `${metric === 'throughput' ? '≥' : '≤'} ${target}${p99 ? ', p99 no worse' : ''}`,
    rounds,
    ratio,
    ...(p99 ? { p99 } : {}),
    pass: !failedRequests && (QUICK || (meets && (p99?.pass ?? true))),
  };
}

// ---------------------------------------------------------------------------------------------
// SCIM (issue 43)

/**
 * The SCIM rows, on each back-end: PostgreSQL (a fresh database of their own) and PGlite (a
 * fresh data directory: the server's default back-end), each with a server of its own. One
 * organization with a verified domain and four directories: `users` directory users seeded in
 * SQL (the volume), `small` seeded the same way (the baseline), one the POSTs fill from empty and
 * one that warms the server up first (--quick, which only shows the rows run: 2,000 and 100 users, 300 POSTs).
 */
const SCIM = QUICK ? { users: 2_000, small: 100, posts: 300, window: 100 } : { users: 100_000, small: 1_000, posts: 10_000, window: 1_000 };
const SCIM_DOMAIN = 'scim-bench.example';
/**
 * Concurrent POSTs while provisioning, and connections of the load generator for the list rows:
 * Okta and Entra ID send a few requests at a time, not 50.
 */
const SCIM_CONCURRENCY = 4;
/**
 * The list rows' filters, each matching the same share of both seeded directories: a quarter
 * (the userNames of one department of four), a hundredth (work addresses whose number ends in
 * 77) and nine tenths; and the most their first page may cost against the same in SCIM.small
 * users (it counts every match: see scimRowsOf).
 */
const SCIM_FILTERS = [
  { filter: 'userName sw "eng."', firstPage: 3 },
  { filter: 'emails[type eq "work"].value co "77@"', firstPage: 6 },
  { filter: 'active eq true', firstPage: 3 },
];

interface ScimDirectory {
  id: number;
  token: string;
}

interface ScimFixture {
  big: ScimDirectory;
  small: ScimDirectory;
  posts: ScimDirectory;
  warm: ScimDirectory;
}

/**
 * The SCIM organization and its directories. The seeded users are what POST would have made:
 * an account, a membership and a directory user each, userName `<department>.<n>@<domain>`
 * (four departments in turn), a work and a home address, every tenth one inactive; their
 * numbers run on from one directory to the next, so addresses stay unique.
 */
async function seedScim(db: DB, label: string): Promise<ScimFixture> {
  console.log(`SCIM ${label}: seeding ${(SCIM.users + SCIM.small).toLocaleString('en')} directory users...`);
  const org = await db.insertInto('organizations').values({ name: 'SCIM Bench' }).returning('id').executeTakeFirstOrThrow();
  await db.insertInto('sso_domains').values({ organization_id: org.id, domain: SCIM_DOMAIN, state: 'verified', verification_token: 'bench', verified_at: new Date() }).execute();
  let seeded = 0;
  const directory = async (name: string, users: number): Promise<ScimDirectory> => {
    const { directory: d, token } = await createDirectory(db, org.id, { name });
    if (users > 0) {
      await sql`with u as (
          insert into users (email, name, password_hash, email_verified_at)
          select (array['sales', 'eng', 'ops', 'support'])[1 + g % 4] || '.' || g || ${`@${SCIM_DOMAIN}`}, 'Person ' || g, null, now()
          from generate_series(${seeded + 1}::int, ${seeded + users}::int) g
          returning id, email, name),
        m as (insert into memberships (organization_id, user_id, role) select ${org.id}, id, 'member' from u)
        insert into directory_users (directory_id, user_id, user_name, external_id, display_name, active, resource, role)
        select ${d.id}, u.id, u.email, 'ext-' || u.id, u.name, right(split_part(u.email, '@', 1), 1) <> '0',
          jsonb_build_object(
            'name', jsonb_build_object('givenName', 'Person', 'familyName', u.name),
            'emails', jsonb_build_array(jsonb_build_object('type', 'work', 'value', u.email, 'primary', true), jsonb_build_object('type', 'home', 'value', 'home.' || u.id || '@home.example'))),
          'member'
        from u order by u.id`.execute(db);
      seeded += users;
    }
    return { id: d.id, token };
  };
  const fixture = { big: await directory('Volume', SCIM.users), small: await directory('Baseline', SCIM.small), posts: await directory('Provisioning', 0), warm: await directory('Warm-up', 0) };
  // A settled table, as autovacuum leaves one: statistics and a visibility map.
  await sql`vacuum analyze`.execute(db);
  return fixture;
}

async function scimGet(port: number, d: ScimDirectory, pathAndQuery: string): Promise<Record<string, unknown>> {
  const res = await fetch(`http://127.0.0.1:${port}/scim/v2/${d.id}${pathAndQuery}`, { headers: { authorization: `Bearer ${d.token}`, accept: 'application/scim+json' } });
  if (res.status !== 200) throw new Error(`SCIM GET ${pathAndQuery}: ${res.status} ${(await res.text()).slice(0, 300)}`);
  return (await res.json()) as Record<string, unknown>;
}

const scimUsersQuery = (filter: string, startIndex: number, count: number) => `/Users?filter=${encodeURIComponent(filter)}&startIndex=${startIndex}&count=${count}`;

/** Where a client paging by 100 is nine tenths of the way through `total` results. */
const deepIndex = (total: number) => Math.max(1, Math.floor((total * 0.9) / 100) * 100 + 1);

/**
 * Pages through `filter` from the first result to `to` as a client does before asking for the
 * page at `to` (by MAX_COUNT while it can, then by 100, asking for ids only).
 */
async function scimWalk(port: number, d: ScimDirectory, filter: string, to: number): Promise<void> {
  for (let start = 1; start < to; ) {
    const count = to - start >= MAX_COUNT ? MAX_COUNT : 100;
    await scimGet(port, d, `${scimUsersQuery(filter, start, count)}&attributes=id`);
    start += count;
  }
}

/**
 * `count` users POSTed to `d`, SCIM_CONCURRENCY at a time: each answer's time, in the order they
 * completed, and when (milliseconds since the start).
 */
async function scimProvision(port: number, d: ScimDirectory, count: number, prefix: string): Promise<{ done: { at: number; ms: number }[]; failed: number }> {
  const done: { at: number; ms: number }[] = [];
  let failed = 0;
  let next = 0;
  const started = performance.now();
  const worker = async () => {
    for (let i = next++; i < count; i = next++) {
      const address = `${prefix}.${i}@${SCIM_DOMAIN}`;
      const sent = performance.now();
      const res = await fetch(`http://127.0.0.1:${port}/scim/v2/${d.id}/Users`, {
        method: 'POST',
        headers: { authorization: `Bearer ${d.token}`, 'content-type': 'application/scim+json', accept: 'application/scim+json' },
        body: JSON.stringify({
          schemas: ['urn:ietf:params:scim:schemas:core:2.0:User'],
          userName: address,
          externalId: `${prefix}-${i}`,
          name: { givenName: 'New', familyName: `Person ${i}` },
          displayName: `New Person ${i}`,
          emails: [{ primary: true, value: address, type: 'work' }],
          active: true,
        }),
      });
      const body = await res.text();
      const now = performance.now();
      done.push({ at: now - started, ms: now - sent });
      if (res.status !== 201) {
        if (failed++ === 0) console.error(`SCIM POST /Users: ${res.status} ${body.slice(0, 300)}`);
      }
    }
  };
  await Promise.all(Array.from({ length: SCIM_CONCURRENCY }, worker));
  return { done, failed };
}

/** The requests a second, p50 and p99 of `window` consecutive answers, the first of them at `from`. */
function scimWindow(done: { at: number; ms: number }[], from: number, window: number, failed: number): Measured {
  const slice = done.slice(from, from + window);
  const startedAt = from === 0 ? 0 : done[from - 1]!.at;
  const ms = slice.map((d) => d.ms).sort((a, b) => a - b);
  return {
    rps: window / ((slice.at(-1)!.at - startedAt) / 1000),
    p50: Math.round(ms[Math.floor(ms.length / 2)]!),
    p99: Math.round(ms[Math.min(ms.length - 1, Math.floor(ms.length * 0.99))]!),
    non2xx: failed,
  };
}

/**
 * The SCIM rows of one back-end, against its server on `port`:
 * - provisioning: SCIM.posts users POSTed into an empty directory (after SCIM.window into
 *   another, to warm the server up); the requests a second of the last SCIM.window against
 *   the first. Each POST checks the userName and the address, creates the account, the
 *   membership and the directory user and audits it: none of that may grow with the directory.
 * - the first page of each filter in SCIM.users users against the same in SCIM.small, and a
 *   page nine tenths of the way through its matches against that first page (p50 latency,
 *   SCIM_CONCURRENCY connections). The deep page is reached as a client reaches it, paging on
 *   from the first. A first page counts every match (totalResults; listing.ts carries the count
 *   to the pages after it), so it grows with the matches, through an index (migration 0028);
 *   the pages after it must not.
 */
async function scimRowsOf(label: string, port: number, fx: ScimFixture): Promise<ScenarioResult[]> {
  const results: ScenarioResult[] = [];
  const name = `SCIM ${label}: POST /Users, the last ${SCIM.window.toLocaleString('en')} of ${SCIM.posts.toLocaleString('en')}`;
  if (ONLY === undefined || name.includes(ONLY)) {
    console.log(`${name}...`);
    await scimProvision(port, fx.warm, SCIM.window, 'warm');
    const { done, failed } = await scimProvision(port, fx.posts, SCIM.posts, 'new');
    const first = scimWindow(done, 0, SCIM.window, failed);
    const last = scimWindow(done, SCIM.posts - SCIM.window, SCIM.window, failed);
    const ratio = last.rps / first.rps;
    results.push({
      scenario: name,
      baseline: `the first ${SCIM.window.toLocaleString('en')}`,
      metric: 'throughput',
      target: '≥ 0.8',
      rounds: [{ scenario: last, baseline: first }],
      ratio,
      pass: failed === 0 && (QUICK || ratio >= 0.8),
    });
  }
  const users = (n: number) => n.toLocaleString('en');
  for (const { filter, firstPage } of SCIM_FILTERS) {
    const rowName = (page: string) => `SCIM ${label}: ${filter}, ${page}`;
    if (ONLY !== undefined && !rowName('first page').includes(ONLY) && !rowName('a page').includes(ONLY)) continue;
    const bigTotal = Number((await scimGet(port, fx.big, scimUsersQuery(filter, 1, 0))).totalResults);
    const smallTotal = Number((await scimGet(port, fx.small, scimUsersQuery(filter, 1, 0))).totalResults);
    const list = (scenario: string, d: ScimDirectory, startIndex: number): Load => ({
      name: scenario,
      port,
      method: 'GET',
      path: `/scim/v2/${d.id}${scimUsersQuery(filter, startIndex, 100)}`,
      headers: { authorization: `Bearer ${d.token}`, accept: 'application/scim+json' },
      connections: SCIM_CONCURRENCY,
    });
    const add = (r: ScenarioResult | undefined) => void (r && results.push(r));
    // The first page counts every match (totalResults): it grows with them, within firstPage.
    const first = list(`first page of ${users(bigTotal)} in ${users(SCIM.users)}`, fx.big, 1);
    add(await runScenario({ ...first, name: rowName(first.name) }, list(`first page of ${users(smallTotal)} in ${users(SCIM.small)}`, fx.small, 1), 'p50 latency', firstPage));
    // Paging on from there must not cost more than the first page did (nor grow with startIndex).
    const deep = deepIndex(bigTotal);
    if (deep === 1) continue;
    console.log(`SCIM ${label}: paging ${filter} to ${users(deep)}...`);
    await scimWalk(port, fx.big, filter, deep);
    add(await runScenario(list(rowName(`a page at ${users(deep)} of ${users(bigTotal)} in ${users(SCIM.users)}, paged to`), fx.big, deep), first, 'p50 latency', 1));
  }
  return results;
}

/**
 * The SCIM rows on PostgreSQL and on PGlite, each on a server of its own started for them and
 * stopped after (`--only "SCIM PGlite"` or `--only "SCIM PostgreSQL"`: one back-end).
 */
async function scimRows(): Promise<ScenarioResult[]> {
  const results: ScenarioResult[] = [];
  const named = (label: string) => ONLY !== undefined && (`SCIM ${label}:`.startsWith(ONLY) || ONLY.startsWith(`SCIM ${label}:`));
  // --quick (CI's check that the bench still runs) does PostgreSQL's rows only, unless --only names PGlite's: they add a minute.
  const wanted = (label: string) => named(label) || (ONLY === undefined && !(QUICK && label === 'PGlite'));
  // The database migrated and seeded, then a server on it for the rows.
  const run = async (label: string, target: DatabaseTarget, server: string | { dataDir: string }) => {
    const handle = await connectDatabase(target, { queryTimeoutMs: 3_600_000 });
    let fx: ScimFixture;
    try {
      await migrateToLatest(handle.db);
      fx = await seedScim(handle.db, label);
    } finally {
      await handle.close();
    }
    const port = await freePort();
    const child = await startServer(server, port);
    try {
      results.push(...(await scimRowsOf(label, port, fx)));
    } finally {
      child.kill('SIGTERM');
      await new Promise((r) => child.once('exit', r));
    }
  };
  if (wanted('PostgreSQL')) {
    const database = `orgauth_bench_scim_${process.pid}`;
    await admin((c) => c.query(`create database ${database}`));
    try {
      if (bouncer) await admin((c) => c.query(`alter role current_user in database ${database} set statement_timeout = '${SERVER_STATEMENT_TIMEOUT_MS}ms'`));
      await run('PostgreSQL', { kind: 'postgres', url: dbUrl(database) }, dbUrl(database));
    } finally {
      await admin((c) => c.query(`drop database if exists ${database} with (force)`));
    }
  }
  if (wanted('PGlite')) {
    const dataDir = mkdtempSync(path.join(tmpdir(), 'orgauth-bench-scim-'));
    try {
      await run('PGlite', { kind: 'pglite', dataDir: path.join(dataDir, 'pgdata') }, { dataDir });
    } finally {
      rmSync(dataDir, { recursive: true, force: true });
    }
  }
  return results;
}

/** The table of results (the header says how they were measured). */
function printResults(results: ScenarioResult[]): void {
  console.log(
    `\norgauth benchmark${QUICK ? ' (--quick: one short round, no thresholds)' : ''}${bouncer ? ' through PgBouncer (transaction mode)' : ''}: ${CONNECTIONS} connections (SCIM lists: ${SCIM_CONCURRENCY}), ${QUICK ? `1 round of ${QUICK_REQUESTS_PER_CONNECTION} requests per connection` : `${ROUNDS} × ${ROUND_S} s rounds after ${WARMUP_S} s warm-up`}`,
  );
  console.log(tableLine(['scenario', 'req/s', 'p50 ms', 'p99 ms', 'baseline', 'baseline req/s', 'ratio (median)', 'target', 'result']));
  console.log(tableLine(Array(9).fill('---')));
  for (const r of results) {
    const last = r.rounds.at(-1)!;
    const p99 = r.p99 ? ` (p99 ${r.p99.scenario} vs ${r.p99.baseline} ms)` : '';
    console.log(
      tableLine([
        r.scenario, last.scenario.rps.toFixed(0), String(last.scenario.p50), String(last.scenario.p99), r.baseline, last.baseline.rps.toFixed(0),
        `${r.ratio.toFixed(3)} (${r.metric})${p99}`, r.target, r.pass ? 'pass' : 'FAIL',
      ]),
    );
  }
}

const tableLine = (cells: string[]) => `| ${cells.join(' | ')} |`;

async function main(): Promise<void> {
  PORT = await freePort();
  const largePort = await freePort();
  const peerPort = await freePort();
  buildServer();
  // `--only SCIM...`: the SCIM rows need none of the templates, servers or peer of the others.
  if (ONLY?.startsWith('SCIM')) {
    const results = await scimRows();
    printResults(results);
    mkdirSync(path.join(ROOT, 'bench/results'), { recursive: true });
    writeFileSync(path.join(ROOT, 'bench/results/latest.json'), `${JSON.stringify({ quick: QUICK, date: new Date().toISOString(), results }, null, 2)}\n`);
    if (!results.every((r) => r.pass)) process.exitCode = 1;
    return;
  }
  await ensureTemplate();
  await ensureLargeTemplate();
  await ensureAuditVolume();
  const runDb = `orgauth_bench_run_${process.pid}`;
  const largeDb = `orgauth_bench_run_large_${process.pid}`;
  await admin(async (c) => {
    await c.query(`create database ${runDb} template ${TEMPLATE}`);
    await c.query(`create database ${largeDb} template ${LARGE_TEMPLATE}`);
  });
  const servers: ChildProcess[] = [];
  try {
    const prepare = async (database: string, port: number) => {
      const handle = await connectDatabase({ kind: 'postgres', url: dbUrl(database) });
      try {
        // The templates hold the bulk data as of when they were built: bring the schema up to
        // date before seeding, as the server would at start.
        await migrateToLatest(handle.db);
        return await seedRun(handle.db, port);
      } finally {
        await handle.close();
      }
    };
    if (PGBOUNCER) {
      const binary = findPgBouncer();
      if (typeof binary === 'string') throw new Error(binary);
      // As many server connections per database as the servers' pools, so the pooler is not the bottleneck.
      bouncer = await startPgBouncer(binary, { upstream: ADMIN_URL, poolSize: 10 });
      for (const database of [runDb, largeDb]) {
        await admin((c) => c.query(`alter role current_user in database ${database} set statement_timeout = '${SERVER_STATEMENT_TIMEOUT_MS}ms'`));
      }
    }
    const fx = await prepare(runDb, PORT);
    const large = await prepare(largeDb, largePort);
    const disableFx = await (async () => {
      const handle = await connectDatabase({ kind: 'postgres', url: dbUrl(largeDb) });
      try {
        return { ...(await seedDisable(handle.db, largePort)), overview: await seedOverview(handle.db) };
      } finally {
        await handle.close();
      }
    })();
    const server = await startServer(dbUrl(runDb), PORT);
    servers.push(server);
    // Loads a million revocations at start: how long that takes is part of what is measured.
    const largeStart = performance.now();
    const largeServer = await startServer(dbUrl(largeDb), largePort);
    const largeStartMs = performance.now() - largeStart;
    servers.push(largeServer);
    // The peer's private_key_jwt client registers the same public key as orgauth's.
    const keyClientJwk = { ...createPublicKey(fx.keyClient.key).export({ format: 'jwk' }), kid: fx.keyClient.kid, alg: 'ES256', use: 'sig' };
    servers.push(await startPeer(peerPort, { keys: [keyClientJwk] }));

    const { smallToken, bigToken } = fx;
    // Past the end, the last one again: its 4xx answers fail the scenario (a throw here, inside
    // autocannon, would end this process and leave the server running).
    let ranOut = false;
    const taker = (list: string[]) => {
      let i = 0;
      return () => {
        if (i < list.length) return list[i++]!;
        ranOut = true;
        return list.at(-1)!;
      };
    };
    const hello: Load = { name: 'GET /bench/hello', method: 'GET', path: '/bench/hello' };
    const results: ScenarioResult[] = [];
    const add = (result: ScenarioResult | undefined) => void (result && results.push(result));
    const tokenLoad = (name: string, port: number, authorization: string, body: () => string): Load => ({
      name,
      port,
      method: 'POST',
      path: '/oauth/token',
      headers: { authorization },
      body,
    });
    const contactsLoad = (name: string, port: number, f: Fixture): Load => ({
      name,
      port,
      method: 'GET',
      path: `/api/v1/${f.smallOrg}/contacts?limit=50`,
      headers: { authorization: `Bearer ${f.smallToken}`, accept: 'application/json' },
    });
    const clientCredentials = (name: string, port: number, f: Fixture) =>
      tokenLoad(name, port, f.privateBasic, () => `grant_type=client_credentials&organization_id=${f.smallOrg}&scope=contacts.read`);
    // One sequence per database: a refresh token is good once, whichever scenario sends it.
    const refreshTakers = new Map<Fixture, () => string>();
    const refresh = (name: string, port: number, f: Fixture) => {
      if (!refreshTakers.has(f)) refreshTakers.set(f, taker(f.refreshTokens));
      const next = refreshTakers.get(f)!;
      return tokenLoad(name, port, f.publicBasic, () => `grant_type=refresh_token&refresh_token=${next()}`);
    };
    const nextCode = taker(fx.codes);

    add(await runScenario(contactsLoad('GET /api/v1/:org/contacts?limit=50', PORT, fx), { name: 'GET /bench/contacts', method: 'GET', path: `/bench/contacts?org=${fx.smallOrg}&limit=50` }, 'throughput', 0.85));
    add(await runScenario(clientCredentials('POST /oauth/token client_credentials', PORT, fx), hello, 'throughput', 0.15));
    add(await runScenario(refresh('POST /oauth/token refresh_token', PORT, fx), hello, 'throughput', 0.07));
    add(
      await runScenario(
        tokenLoad('POST /oauth/token authorization_code', PORT, fx.publicBasic, () => `grant_type=authorization_code&code=${nextCode()}&redirect_uri=${encodeURIComponent(REDIRECT)}`),
        hello,
        'throughput',
        0.06,
      ),
    );
    const firstPage: Load = { name: 'first page of 10,000', method: 'GET', path: `/api/v1/${fx.smallOrg}/contacts?limit=25`, headers: { authorization: `Bearer ${smallToken}`, accept: 'application/json' } };
    const big = (name: string, query: string): Load => ({
      name,
      method: 'GET',
      path: `/api/v1/${fx.bigOrg}/contacts?limit=25&${query}`,
      headers: { authorization: `Bearer ${bigToken}`, accept: 'application/json' },
    });
    add(await runScenario(big('contacts page 40,000 of 1,000,000', `cursor=${fx.deepCursor}`), firstPage, 'p50 latency', 1.3));
    add(await runScenario(big('contacts search for an absent term in 1,000,000', 'q=zqxj'), firstPage, 'p50 latency', 2));
    const volume = `(${BULK.live / 1e6}M grants, ${BULK.revoked / 1e6}M revoked, ${BULK.refresh / 1e6}M refresh tokens)`;
    add(await runScenario(clientCredentials(`client_credentials ${volume}`, largePort, large), clientCredentials('client_credentials (small database)', PORT, fx), 'throughput', 0.9));
    add(await runScenario(refresh(`refresh_token ${volume}`, largePort, large), refresh('refresh_token (small database)', PORT, fx), 'throughput', 0.9));
    add(await runScenario(contactsLoad(`GET contacts?limit=50 ${volume}`, largePort, large), contactsLoad('GET contacts?limit=50 (small database)', PORT, fx), 'throughput', 0.9));
    add(
      await runScenario(
        clientCredentials('orgauth client_credentials vs node-oidc-provider', PORT, fx),
        tokenLoad('node-oidc-provider client_credentials', peerPort, `Basic ${Buffer.from(`${PEER_CLIENT_ID}:${PEER_CLIENT_SECRET}`).toString('base64')}`, () => 'grant_type=client_credentials&scope=contacts.read'),
        'throughput',
        2,
        { p99NoWorse: true },
      ),
    );
    // DPoP (RFC 9449): the API with a proof per request against the same API with the bearer token
    // (the issue's target: 0.8); the token endpoint with a proof and without; private_key_jwt
    // against client_secret_basic. A proof or an assertion costs one ES256 verification (about
    // 120 µs on these machines, as much as the rest of a client_credentials request) and one write
    // to the replay store, so those two are held to 0.4: a guard against regressions, while the
    // comparison with node-oidc-provider below says how good that is.
    const issuer = `http://127.0.0.1:${PORT}`;
    const contactsPath = `/api/v1/${fx.smallOrg}/contacts?limit=50`;
    const apiProofs = prepared(() => dpopProof(fx, 'GET', `${issuer}${contactsPath}`, fx.dpop.token));
    const tokenProofs = prepared(() => dpopProof(fx, 'POST', `${issuer}/oauth/token`));
    const assertions = prepared(() => clientAssertion(fx, issuer));
    // The API row's baseline carries a header as large as a proof, set per request as the proof
    // is (the server ignores it): the load generator, which shares the server's two cores, then
    // builds each request alike and sends as many bytes on both sides, and the ratio is what the
    // server spends on the proof. Without it the generator's own per-request work counted against
    // DPoP (autocannon reuses a request's bytes only when nothing is set per request; the token
    // rows set a body per request on both sides already).
    const paddedLike = (load: Load, proof: string): Load => ({ ...load, headersPerRequest: () => ({ 'x-bench-padding': proof }) });
    add(
      await runScenario(
        {
          name: 'GET contacts?limit=50 with a DPoP-bound token and a proof',
          method: 'GET',
          path: contactsPath,
          headers: { authorization: `DPoP ${fx.dpop.token}`, accept: 'application/json' },
          headersPerRequest: () => ({ dpop: apiProofs.next() }),
          prepare: apiProofs.fill,
        },
        paddedLike(contactsLoad('GET contacts?limit=50 with a bearer token', PORT, fx), dpopProof(fx, 'GET', `${issuer}${contactsPath}`, fx.dpop.token)),
        'throughput',
        0.8,
      ),
    );
    add(
      await runScenario(
        {
          ...clientCredentials('POST /oauth/token client_credentials with a DPoP proof', PORT, fx),
          headersPerRequest: () => ({ dpop: tokenProofs.next() }),
          prepare: tokenProofs.fill,
        },
        clientCredentials('POST /oauth/token client_credentials without DPoP', PORT, fx),
        'throughput',
        0.4,
      ),
    );
    // client_credentials with a client assertion per request, and a DPoP proof per request when
    // `proofs` is given; `params` are the server's own (orgauth's organization_id).
    const assertionParams = `client_assertion_type=${encodeURIComponent(CLIENT_ASSERTION_TYPE)}&client_assertion=`;
    const keyedLoad = (name: string, port: number, params: string, signed: ReturnType<typeof prepared>, proofs?: ReturnType<typeof prepared>): Load => ({
      name,
      port,
      method: 'POST',
      path: '/oauth/token',
      body: () => `grant_type=client_credentials&scope=contacts.read&${params}${assertionParams}${signed.next()}`,
      ...(proofs !== undefined && { headersPerRequest: () => ({ dpop: proofs.next() }) }),
      prepare: (seconds) => {
        proofs?.fill(seconds);
        signed.fill(seconds);
      },
    });
    add(
      await runScenario(
        keyedLoad('client_credentials with private_key_jwt', PORT, `organization_id=${fx.smallOrg}&`, assertions),
        clientCredentials('client_credentials with client_secret_basic', PORT, fx),
        'throughput',
        0.4,
      ),
    );
    // Token exchange (RFC 8693): a resource exchanging the user's token it received for one to the
    // next resource (its credentials, the subject token's checks in the database, the user's role,
    // an audit event, a write) against client_credentials, which reads nothing from the database:
    // 0.073–0.090 in full runs on 2026-12-07 (917–981 req/s; docs/performance.md says where the time
    // goes), a guard against regressions at 0.05.
    add(
      await runScenario(
        tokenLoad('POST /oauth/token token exchange (on behalf of)', PORT, fx.exchange.basic, () =>
          `grant_type=${encodeURIComponent('urn:ietf:params:oauth:grant-type:token-exchange')}&subject_token=${fx.exchange.subjectToken}&subject_token_type=${encodeURIComponent('urn:ietf:params:oauth:token-type:access_token')}&resource=${encodeURIComponent(fx.exchange.target)}`),
        clientCredentials('POST /oauth/token client_credentials', PORT, fx),
        'throughput',
        0.05,
      ),
    );
    // The whole of it against the best: client_credentials with private_key_jwt and a DPoP proof,
    // orgauth and node-oidc-provider (the same key, the same request shape).
    const peerIssuer = `http://127.0.0.1:${peerPort}`;
    const peerAssertions = prepared(() => clientAssertion(fx, peerIssuer, `${PEER_CLIENT_ID}-keys`));
    const peerProofs = prepared(() => dpopProof(fx, 'POST', `${peerIssuer}/oauth/token`));
    add(
      await runScenario(
        keyedLoad('orgauth client_credentials with private_key_jwt and DPoP vs node-oidc-provider', PORT, `organization_id=${fx.smallOrg}&`, assertions, tokenProofs),
        keyedLoad('node-oidc-provider client_credentials with private_key_jwt and DPoP', peerPort, '', peerAssertions, peerProofs),
        'throughput',
        1.5,
        { p99NoWorse: true },
      ),
    );
    // The Overview reads counters, LIMITs and index ranges only: an organization with a million
    // live grants, a million revoked and a million audit events against a new, empty one.
    const { overview } = disableFx;
    const overviewLoad = (name: string, session: string): Load => ({
      name,
      port: largePort,
      method: 'GET',
      path: '/dashboard',
      headers: { cookie: `orgauth_session=${session}`, accept: 'text/html' },
    });
    add(
      await runScenario(
        overviewLoad(
          `Overview of an organization with ${overview.counts.grants.toLocaleString('en')} live grants and ${overview.counts.audit.toLocaleString('en')} audit events`,
          overview.full,
        ),
        overviewLoad('Overview of an empty organization (the same activity counters)', overview.empty),
        'p50 latency',
        1.2,
      ),
    );
    // Issue 46's rows before the disable row, which revokes a million more of the large
    // database's grants: after it, the start-up row measured a start with two million (3.39 s).
    const wantsSkeptic = ONLY === undefined || ['independent', 'start-up'].some((w) => ONLY.startsWith(w));
    const skeptic = wantsSkeptic ? await skepticRows({ runDb, largeDb, privateBasic: fx.privateBasic, organizationId: fx.smallOrg, peerPort }) : undefined;
    // SCIM (issue 43): on servers and databases of their own, PostgreSQL and PGlite.
    if (ONLY === undefined) results.push(...(await scimRows()));
    const rssMb = peakRssMb(server.pid!);
    const largeRssMb = peakRssMb(largeServer.pid!);
    const disabled =
      ONLY === undefined || 'disable'.includes(ONLY)
        ? await disableAtVolume(largeDb, largePort, disableFx, largeServer, async () => {
            const again = await startServer(dbUrl(largeDb), largePort);
            servers.push(again);
            return again;
          })
        : undefined;
    // Each row's verdict (--quick: none), and the run's.
    const harnessPass = QUICK || !skeptic?.harness || (skeptic.harness.ratio >= HARNESS_TARGET && skeptic.harness.failures.length === 0);
    const emptyPass = QUICK || !skeptic?.startUp || skeptic.startUp.emptyMs <= START_UP_EMPTY_MS;
    const largePass = QUICK || !skeptic?.startUp || skeptic.startUp.largeMs <= START_UP_LARGE_MS;
    const skepticPass = harnessPass && emptyPass && largePass;

    const line = tableLine;
    printResults(results);
    if (skeptic?.harness) {
      const { harness: h } = skeptic;
      console.log(
        line([
          'independent harness: orgauth (npm start, production) vs node-oidc-provider, client_credentials, load generator in its own process',
          median(h.rounds.map((r) => r.orgauth)).toFixed(0),
          '', '',
          'node-oidc-provider',
          median(h.rounds.map((r) => r.peer)).toFixed(0),
          `${h.ratio.toFixed(3)} (rounds ${h.rounds.map((r) => r.ratio.toFixed(2)).join(', ')})${h.failures.length ? `; ${h.failures.join('; ')}` : ''}`,
          `≥ ${HARNESS_TARGET}`,
          harnessPass ? 'pass' : 'FAIL',
        ]),
      );
      if (h.floorRatio !== undefined) {
        console.log(
          line([
            'its floor: Fastify, the same form parser and signing thread, no token logic (bench/floor-server.ts), vs the same peer rounds',
            median(h.rounds.map((r) => r.floor ?? 0)).toFixed(0),
            '', '',
            'node-oidc-provider',
            median(h.rounds.map((r) => r.peer)).toFixed(0),
            `${h.floorRatio.toFixed(3)} (rounds ${h.rounds.map((r) => (r.floorRatio ?? 0).toFixed(2)).join(', ')})`,
            'none: what the machine allows',
            '',
          ]),
        );
      }
    }
    if (skeptic?.startUp) {
      const { emptyMs, largeMs } = skeptic.startUp;
      console.log(line(['start-up: spawn to /healthz, empty database', '', '', '', '', '', `${(emptyMs / 1000).toFixed(2)} s`, `≤ ${START_UP_EMPTY_MS / 1000} s`, emptyPass ? 'pass' : 'FAIL']));
      console.log(line([`start-up: spawn to /healthz ${volume}`, '', '', '', '', '', `${(largeMs / 1000).toFixed(2)} s`, `≤ ${START_UP_LARGE_MS / 1000} s`, largePass ? 'pass' : 'FAIL']));
    }
    const rssPass = QUICK || (rssMb <= 250 && largeRssMb <= 250);
    console.log(line(['peak RSS of the server', `${rssMb.toFixed(0)} MB`, '', '', '', '', '', '≤ 250 MB', rssMb <= 250 || QUICK ? 'pass' : 'FAIL']));
    console.log(line([`peak RSS of the server ${volume}`, `${largeRssMb.toFixed(0)} MB`, '', '', '', '', `ready in ${(largeStartMs / 1000).toFixed(1)} s`, '≤ 250 MB', largeRssMb <= 250 || QUICK ? 'pass' : 'FAIL']));
    if (disabled) {
      const d = disabled;
      console.log(
        line([
          `disable an application holding ${d.grants.toLocaleString('en')} grants`,
          '', '', '', '', '',
          `answered in ${d.answerMs.toFixed(0)} ms, token refused ${d.refusedMs.toFixed(0)} ms later; server SIGKILLed at ${d.killedAt.toLocaleString('en')} revoked, a new one finished: ${d.revoked.toLocaleString('en')} revoked${d.revokedOnce ? ', each once' : ' (NOT each once)'}, ${d.jobS.toFixed(0)} s in all`,
          'answer < 1 s, refused < 1 s, every grant revoked once',
          d.pass ? 'pass' : 'FAIL',
        ]),
      );
    }
    mkdirSync(path.join(ROOT, 'bench/results'), { recursive: true });
    writeFileSync(path.join(ROOT, 'bench/results/latest.json'), `${JSON.stringify({ quick: QUICK, date: new Date().toISOString(), results, peakRssMb: rssMb, largePeakRssMb: largeRssMb, largeStartMs, disabled, skeptic }, null, 2)}\n`);
    if (ranOut) console.error(`ran out of pre-issued refresh tokens or codes (${PRE_ISSUED} each): raise PRE_ISSUED`);
    if (!results.every((r) => r.pass) || !rssPass || ranOut || (disabled && !disabled.pass) || !skepticPass) process.exitCode = 1;
  } finally {
    for (const child of servers) child.kill('SIGTERM');
    await new Promise((r) => setTimeout(r, 300));
    await bouncer?.stop();
    await admin(async (c) => {
      await c.query(`drop database if exists ${runDb} with (force)`);
      await c.query(`drop database if exists ${largeDb} with (force)`);
    });
  }
}

/** HTTP Basic client authentication (RFC 6749 §2.3.1, ids and secrets of URL-safe characters). */
const basic = (id: string, secret: string) => `Basic ${Buffer.from(`${id}:${secret}`).toString('base64')}`;

/** Start-up from spawn to /healthz: empty database at most this, and with the large template's volume. */
const START_UP_EMPTY_MS = 1500;
const START_UP_LARGE_MS = 2000;
/** Issue 46: the independent harness's ratio to node-oidc-provider, at least. */
const HARNESS_TARGET = 3;

/** The median of three spawns of the production server on `database`, from spawn to /healthz. */
async function startUpMs(database: string): Promise<number> {
  const times: number[] = [];
  for (let i = 0; i < (QUICK ? 1 : 3); i++) {
    const { child, readyMs } = await startProductionServer(ROOT, { databaseUrl: dbUrl(database), secretKey: SECRET_KEY, port: await freePort() });
    times.push(readyMs);
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGTERM');
    await exited;
  }
  return median(times);
}

/**
 * Issue 46's rows, measured as a skeptic would: the production server (`npm start`'s) from spawn
 * to /healthz on an empty database and on the large one, and the independent harness against
 * node-oidc-provider (bench/harness.ts).
 */
async function skepticRows(input: { runDb: string; largeDb: string; privateBasic: string; organizationId: number; peerPort: number }) {
  // `--only start-up` or `--only independent`: one of the two.
  const startUp = ONLY?.startsWith('independent') ? undefined : await startUpRows(input.largeDb);
  if (ONLY?.startsWith('start-up')) return { startUp, harness: undefined };
  const port = await freePort();
  // BENCH_CPU_PROF=1: this server writes its V8 CPU profile to bench/results/ too (the harness's load only).
  const nodeFlags = process.env.BENCH_CPU_PROF ? ['--cpu-prof', `--cpu-prof-dir=${path.join(ROOT, 'bench/results')}`] : [];
  const { child } = await startProductionServer(ROOT, { databaseUrl: dbUrl(input.runDb), secretKey: SECRET_KEY, port, nodeFlags });
  const floorPort = await freePort();
  const floorBasic = basic('floor', 'floor-secret');
  let harness: HarnessResult;
  try {
    const floor = await startFloor(floorPort, floorBasic);
    try {
      harness = await independentHarness(
        ROOT,
        {
          orgauth: { port, basic: input.privateBasic, organizationId: input.organizationId },
          peer: { port: input.peerPort, basic: basic(PEER_CLIENT_ID, PEER_CLIENT_SECRET) },
          floor: { port: floorPort, basic: floorBasic },
        },
        QUICK,
      );
    } finally {
      floor.kill('SIGTERM');
    }
  } finally {
    child.kill('SIGTERM');
  }
  return { startUp, harness };
}

/** Start-up from spawn to /healthz on an empty (migrated) database and on the large one. */
async function startUpRows(largeDb: string): Promise<{ emptyMs: number; largeMs: number }> {
  const emptyDb = `orgauth_bench_run_empty_${process.pid}`;
  await admin((c) => c.query(`create database ${emptyDb}`));
  let emptyMs: number;
  try {
    const handle = await connectDatabase({ kind: 'postgres', url: dbUrl(emptyDb) });
    try {
      await migrateToLatest(handle.db);
    } finally {
      await handle.close();
    }
    emptyMs = await startUpMs(emptyDb);
  } finally {
    await admin((c) => c.query(`drop database if exists ${emptyDb} with (force)`));
  }
  return { emptyMs, largeMs: await startUpMs(largeDb) };
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});

/**
 * The single sign-on statements stay index lookups at volume (issue 25), on PostgreSQL (PGlite
 * plans a table of this size no differently, and loading it there would take minutes): 200,000
 * users, 20,000 organizations each with a connection (one in ten disabled), one organization
 * whose connection holds 200,000 identity links and 200,000 members, 100,000 sessions of which
 * one in ten was signed in through a connection (5,000 through the large one), 200,000 sign-ins
 * in flight (one in fifty expired), 200,000 SAML assertion IDs in the replay store (one in fifty
 * expired) and 50,000 claimed domains (four in five verified), all ANALYZEd.
 *
 * Each statement is the one the source sends, captured from the repository function itself as it
 * runs (the statements before it run for real, inside the function's transaction, which the
 * capture rolls back), then EXPLAINed with its parameters, with the planner's own choices (no
 * enable_seqscan = off: at this volume it must choose the index by itself). None may read one of
 * these tables sequentially, and each must reach its rows through the index named here.
 */
import { type CompiledQuery, sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findSession } from '../../src/accounts/sessions.js';
import type { DB } from '../../src/db/connect.js';
import { deleteExpired } from '../../src/retention.js';
import { testConfig } from '../helpers/app.js';
import { createTestDatabase, TEST_DATABASE_URL } from '../helpers/db.js';
import { explain, firstQueryOf, nodesOf, type PlanNode } from '../helpers/plans.js';
import { updateConnection } from '../../src/sso/connections.js';
import { findSsoRoute, hasVerifiedDomain, updateDomain } from '../../src/sso/domains.js';
import { resolveUpstreamIdentity, type UpstreamIdentity } from '../../src/sso/identities.js';
import { recordSamlResponse, takeOidcSignIn, takeParkedSignIn } from '../../src/sso/sign-ins.js';

const USERS = 200_000;
const ORGANIZATIONS = 20_000;
const SESSIONS = 100_000;
const SIGN_INS = 200_000;
const ASSERTIONS = 200_000;
const DOMAINS = 50_000;
const BIG_ISSUER = 'https://idp.big.example';

class Captured extends Error {}

/**
 * The first statement `fn` sends through `db` whose SQL matches `pattern`, captured before it
 * runs; the statements before it run (so the function gets that far), and the capture's error
 * rolls back the transaction they ran in.
 */
async function statementOf(db: DB, fn: (db: DB) => Promise<unknown>, pattern: RegExp): Promise<CompiledQuery> {
  let compiled: CompiledQuery | undefined;
  const executor = db.getExecutor();
  const capturing = db.withPlugin({
    transformQuery: ({ node, queryId }) => {
      const query = executor.compileQuery(node, queryId);
      if (compiled === undefined && pattern.test(query.sql)) {
        compiled = query;
        throw new Captured();
      }
      return node;
    },
    transformResult: async ({ result }) => result,
  });
  await fn(capturing).catch((err: unknown) => {
    if (!(err instanceof Captured)) throw err;
  });
  if (!compiled) throw new Error(`no statement matching ${pattern}`);
  return compiled;
}

/** The tables of this test, all of them large enough that a sequential read is a defect. */
const TABLES = new Set(['users', 'organizations', 'memberships', 'sessions', 'sso_connections', 'sso_domains', 'sso_identities', 'sso_sign_ins', 'saml_assertion_ids']);

interface Summary {
  statement: string;
  top: string;
  reads: string[];
}

/** How `plan` reads each table: `table: Node Type [index]`. */
function reads(plan: PlanNode): string[] {
  return nodesOf(plan)
    .filter((n) => n['Relation Name'] !== undefined || n['Index Name'] !== undefined)
    .map((n) => `${n['Relation Name'] ?? '(bitmap)'}: ${n['Node Type']}${n['Index Name'] ? ` ${n['Index Name']}` : ''}`);
}

/** The plan's top node: its type, and for a ModifyTable its operation and the relation it changes. */
function top(plan: PlanNode & { Operation?: string }): string {
  return plan['Node Type'] === 'ModifyTable' ? `ModifyTable (${plan.Operation} on ${plan['Relation Name']})` : plan['Node Type'];
}

const summaries: Summary[] = [];

describe.skipIf(!TEST_DATABASE_URL)('the single sign-on statements at volume, on PostgreSQL', () => {
  let t: Awaited<ReturnType<typeof createTestDatabase>>;
  const db = () => t.handle.db;
  let bigOrganizationId: number;
  let bigConnectionId: number;
  let firstConnectionId: number;
  const config = testConfig();
  const settings = { issuer: config.issuer, secretKey: config.secretKey, allowHttp: config.outbound.allowHttp };

  beforeAll(async () => {
    t = await createTestDatabase();
    const d = db();
    await sql`insert into users (email, name, password_hash) select 'u' || g || '@big.example', 'User ' || g, null from generate_series(1, ${USERS}::int) g`.execute(d);
    await sql`insert into organizations (name) select 'Org ' || g from generate_series(1, ${ORGANIZATIONS}::int) g`.execute(d);
    const { minUser } = await d.selectFrom('users').select((eb) => eb.fn.min<number>('id').as('minUser')).executeTakeFirstOrThrow();
    const { minOrg } = await d.selectFrom('organizations').select((eb) => eb.fn.min<number>('id').as('minOrg')).executeTakeFirstOrThrow();
    bigOrganizationId = Number(minOrg);
    // One connection per organization; one in ten disabled.
    await sql`insert into sso_connections (organization_id, protocol, name, state, oidc_issuer, oidc_client_id, oidc_client_secret_sealed, oidc_scopes)
      select id, 'oidc', 'IdP of ' || id, case when id % 10 = 9 then 'disabled' else 'active' end, 'https://idp' || id || '.example', 'orgauth', 'sealed', 'openid email'
      from organizations order by id`.execute(d);
    const { minConnection } = await d.selectFrom('sso_connections').select((eb) => eb.fn.min<number>('id').as('minConnection')).executeTakeFirstOrThrow();
    firstConnectionId = Number(minConnection);
    bigConnectionId = (await d.selectFrom('sso_connections').select('id').where('organization_id', '=', bigOrganizationId).executeTakeFirstOrThrow()).id;
    // Everyone is a member of the large organization and linked to its connection.
    await sql`insert into memberships (organization_id, user_id, role) select ${bigOrganizationId}::bigint, id, 'member' from users`.execute(d);
    await sql`insert into sso_identities (connection_id, user_id, issuer, subject_format, subject, email)
      select ${bigConnectionId}::int, id, ${BIG_ISSUER}, '', 'sub-' || id, email from users`.execute(d);
    // One session in twenty through the large connection, one in twenty through the others, the rest by password.
    await sql`insert into sessions (id_hash, user_id, expires_at, amr, sso_connection_id)
      select encode(sha256(('session ' || g)::bytea), 'hex'), ${minUser}::bigint + g % ${USERS}::int, now() + interval '12 hours',
        case when g % 20 < 2 then '{fed}'::text[] else '{pwd}'::text[] end,
        case when g % 20 = 0 then ${bigConnectionId}::int when g % 20 = 1 then ${firstConnectionId}::int + g % ${ORGANIZATIONS}::int end
      from generate_series(1, ${SESSIONS}::int) g`.execute(d);
    // Sign-ins in flight: OIDC ones (state, nonce) and SAML ones (an AuthnRequest ID); one in fifty expired.
    await sql`insert into sso_sign_ins (handle_hash, connection_id, browser_hash, return_to, oidc_nonce, oidc_code_verifier_sealed, saml_request_id, expires_at)
      select encode(sha256(('state ' || g)::bytea), 'hex'), ${firstConnectionId}::int + g % ${ORGANIZATIONS}::int, encode(sha256(('browser ' || g)::bytea), 'hex'), '/dashboard',
        case when g % 2 = 0 then 'nonce-' || g end, case when g % 2 = 0 then 'sealed' end, case when g % 2 = 1 then '_' || md5('request ' || g) end,
        case when g % 50 = 0 then now() - interval '1 minute' else now() + interval '10 minutes' end
      from generate_series(1, ${SIGN_INS}::int) g`.execute(d);
    await sql`insert into saml_assertion_ids (connection_id, assertion_id, expires_at)
      select ${firstConnectionId}::int + g % ${ORGANIZATIONS}::int, '_' || md5('assertion ' || g),
        case when g % 50 = 0 then now() - interval '1 minute' else now() + interval '1 hour' end
      from generate_series(1, ${ASSERTIONS}::int) g`.execute(d);
    await sql`insert into sso_domains (organization_id, domain, state, verification_token, verified_at)
      select ${bigOrganizationId}::bigint + g % ${ORGANIZATIONS}::int, 'd' || g || '.example', case when g % 5 = 0 then 'pending' else 'verified' end, 'orgauth-domain-verification=token',
        case when g % 5 = 0 then null else now() end
      from generate_series(1, ${DOMAINS}::int) g`.execute(d);
    await sql`analyze`.execute(d);
  }, 300_000);
  afterAll(async () => {
    if (summaries.length > 0 && process.env.SHOW_PLANS) console.info(summaries.map((s) => `${s.statement}\n  top: ${s.top}\n  ${s.reads.join('\n  ')}`).join('\n'));
    await t?.close();
  });

  /**
   * EXPLAINs `query`, records its summary, and checks that no table of ours is read sequentially
   * (but `allowSequential`, a finding the test documents) and that each `table` is read through
   * `index` (one of them, when the planner may fairly choose between two).
   */
  async function expectIndexed(statement: string, query: CompiledQuery, expected: { table: string; index: string | string[] }[], allowSequential: string[] = []): Promise<PlanNode> {
    const plan = await explain(db(), query);
    const json = JSON.stringify(plan);
    summaries.push({ statement, top: top(plan), reads: reads(plan) });
    const sequential = nodesOf(plan).filter((n) => n['Node Type'] === 'Seq Scan' && TABLES.has(n['Relation Name'] ?? '') && !allowSequential.includes(n['Relation Name'] ?? ''));
    expect(sequential.map((n) => n['Relation Name']), json).toEqual([]);
    for (const { table, index } of expected) {
      const indexes = typeof index === 'string' ? [index] : index;
      const scans = nodesOf(plan).filter((n) => indexes.includes(n['Index Name'] ?? ''));
      expect(scans.length, `${table} through ${indexes.join(' or ')}: ${json}`).toBeGreaterThan(0);
      // A bitmap index scan names no relation; the heap scan above it does.
      for (const scan of scans) if (scan['Relation Name'] !== undefined) expect(scan['Relation Name']).toBe(table);
    }
    return plan;
  }

  const identity = (subject: string): UpstreamIdentity => ({ connectionId: bigConnectionId, issuer: BIG_ISSUER, subjectFormat: '', subject, email: undefined, emailVerified: false, name: undefined, amr: [] });

  it('has the volume it claims', async () => {
    const count = async (table: 'users' | 'sso_identities' | 'sessions' | 'sso_sign_ins' | 'saml_assertion_ids' | 'sso_domains') =>
      Number((await db().selectFrom(table).select((eb) => eb.fn.countAll<number>().as('n')).executeTakeFirstOrThrow()).n);
    expect({ users: await count('users'), identities: await count('sso_identities'), sessions: await count('sessions'), signIns: await count('sso_sign_ins'), assertions: await count('saml_assertion_ids'), domains: await count('sso_domains') }).toEqual({
      users: USERS,
      identities: USERS,
      sessions: SESSIONS,
      signIns: SIGN_INS,
      assertions: ASSERTIONS,
      domains: DOMAINS,
    });
    const ssoSessions = await db().selectFrom('sessions').select((eb) => eb.fn.countAll<number>().as('n')).where('sso_connection_id', '=', bigConnectionId).executeTakeFirstOrThrow();
    expect(Number(ssoSessions.n)).toBe(SESSIONS / 20);
  });

  it('the identity link lookup: sso_identities by (connection, issuer, subject format, subject)', async () => {
    const query = await statementOf(db(), (d) => resolveUpstreamIdentity(d, identity('sub-123456')), /from "sso_identities"/);
    expect(query.sql).toMatch(/"connection_id" = \$1 and "issuer" = \$2 and "subject_format" = \$3 and "subject" = \$4/);
    await expectIndexed('resolveUpstreamIdentity: the link lookup', query, [{ table: 'sso_identities', index: 'sso_identities_subject' }]);
  });

  it("a linked user's membership check: memberships by its key or by the user", async () => {
    const query = await statementOf(db(), (d) => resolveUpstreamIdentity(d, identity('sub-123456')), /from "memberships"/);
    // Everyone here is a member of the large organization: the user's own index is the narrower one then.
    await expectIndexed('resolveUpstreamIdentity: the membership check', query, [{ table: 'memberships', index: ['memberships_pkey', 'memberships_user_id_idx'] }]);
  });

  it("findSsoRoute: the verified domain, then its organization's active connections", async () => {
    const domain = await statementOf(db(), (d) => findSsoRoute(d, 'someone@d12.example'), /from "sso_domains"/);
    await expectIndexed('findSsoRoute: the domain', domain, [{ table: 'sso_domains', index: 'sso_domains_verified_domain' }]);
    const connections = await statementOf(db(), (d) => findSsoRoute(d, 'someone@d12.example'), /from "sso_connections"/);
    await expectIndexed("findSsoRoute: the organization's active connections", connections, [{ table: 'sso_connections', index: 'sso_connections_organization' }]);
  });

  it('hasVerifiedDomain (linking and provisioning): sso_domains by (organization, domain), or by the verified domain', async () => {
    const query = await firstQueryOf(db(), (d) => hasVerifiedDomain(d, bigOrganizationId, 'd20000.example'));
    await expectIndexed('hasVerifiedDomain', query, [{ table: 'sso_domains', index: ['sso_domains_organization_domain', 'sso_domains_verified_domain'] }]);
  });

  it("takeOidcSignIn: the UPDATE that consumes the state's sign-in, by handle_hash", async () => {
    const query = await firstQueryOf(db(), (d) => takeOidcSignIn(d, config.secretKey, firstConnectionId + 2, 'state 2', 'browser'));
    expect(query.sql).toMatch(/^update "sso_sign_ins"/);
    await expectIndexed('takeOidcSignIn', query, [{ table: 'sso_sign_ins', index: 'sso_sign_ins_handle_hash_key' }]);
  });

  it('the finish and link handles: sso_sign_ins by handle_hash', async () => {
    const take = await firstQueryOf(db(), (d) => takeParkedSignIn(d, 'h'.repeat(43), { kind: 'bound', browser: 'b'.repeat(64) }));
    expect(take.sql).toMatch(/^delete from "sso_sign_ins"/);
    await expectIndexed('takeParkedSignIn', take, [{ table: 'sso_sign_ins', index: 'sso_sign_ins_handle_hash_key' }]);
  });

  describe("recordSamlResponse (the ACS's transaction)", () => {
    const accepted = (inResponseTo: string | null) => ({
      accepted: { identity: identity('sub-7'), assertionId: '_a-new-assertion', inResponseTo, keepUntil: new Date(Date.now() + 600_000) },
      idpInitiatedAllowed: false,
      relayStateReturnTo: '/dashboard',
    });

    it("the replay store's insert: DO NOTHING, its conflict found through the unique (connection, assertion ID)", async () => {
      const query = await statementOf(db(), (d) => recordSamlResponse(d, accepted('_r')), /insert into "saml_assertion_ids"/);
      expect(query.sql).toMatch(/on conflict do nothing/);
      const plan = (await expectIndexed('recordSamlResponse: the replay-store insert', query, [])) as PlanNode & { Operation?: string; 'Conflict Resolution'?: string; 'Conflict Arbiter Indexes'?: string[] };
      expect(plan).toMatchObject({ 'Node Type': 'ModifyTable', Operation: 'Insert', 'Conflict Resolution': 'NOTHING' });
      // No conflict target: every unique index of the table arbitrates (each an index probe), the
      // primary key (a fresh bigserial, never in conflict) and the one on (connection, assertion ID).
      expect(plan['Conflict Arbiter Indexes']).toBeUndefined();
      const unique = await sql<{ name: string; definition: string }>`
        select c.relname as name, pg_get_indexdef(i.indexrelid) as definition from pg_index i join pg_class c on c.oid = i.indexrelid
        where i.indrelid = 'saml_assertion_ids'::regclass and i.indisunique order by 1`.execute(db());
      expect(unique.rows.map((r) => r.name)).toEqual(['saml_assertion_ids_assertion', 'saml_assertion_ids_pkey']);
      expect(unique.rows[0]!.definition).toMatch(/USING btree \(connection_id, assertion_id\)$/);
      summaries.at(-1)!.reads.push('conflict arbiters: every unique index (saml_assertion_ids_assertion, saml_assertion_ids_pkey)');
    });

    it('the AuthnRequest it answers, consumed by saml_request_id', async () => {
      const query = await statementOf(db(), (d) => recordSamlResponse(d, accepted(`_${'0'.repeat(32)}`)), /update "sso_sign_ins"/);
      expect(query.sql).toMatch(/"saml_request_id" = \$\d+/);
      await expectIndexed('recordSamlResponse: the request consumed', query, [{ table: 'sso_sign_ins', index: 'sso_sign_ins_saml_request_id_key' }]);
      // Nothing was written: the capture rolled the transaction back.
      expect(await db().selectFrom('saml_assertion_ids').select('id').where('assertion_id', '=', '_a-new-assertion').execute()).toEqual([]);
    });
  });

  it("disabling a connection: its sessions deleted through the partial index of SSO sessions", async () => {
    const query = await statementOf(db(), (d) => updateConnection(d, settings, bigOrganizationId, bigConnectionId, { state: 'disabled' }), /delete from "sessions"/);
    expect(query.sql).toMatch(/where "sso_connection_id" = \$1/);
    await expectIndexed('updateConnection: the sessions ended', query, [{ table: 'sessions', index: 'sessions_sso_connection' }]);
    expect((await db().selectFrom('sso_connections').select('state').where('id', '=', bigConnectionId).executeTakeFirstOrThrow()).state).toBe('active');
  });

  it("SSO required turned on: the domain's people found through the index on the addresses' domain part", async () => {
    await db().insertInto('users').values([1, 2, 3].map((i) => ({ email: `p${i}@small.example`, name: '', password_hash: null }))).execute();
    await db().insertInto('sso_domains').values({ organization_id: bigOrganizationId, domain: 'small.example', state: 'verified', verification_token: 't', verified_at: new Date() }).execute();
    const query = await statementOf(db(), (d) => updateDomain(d, bigOrganizationId, 'small.example', { sso_required: true }), /delete from "sessions"/);
    await expectIndexed('updateDomain: the password sessions ended', query, [{ table: 'users', index: 'users_email_domain' }]);
  });

  it('retention: expired sign-ins and assertion IDs found through their expires_at index, then deleted by key', async () => {
    const signIns = await statementOf(db(), (d) => deleteExpired(d), /^\s*delete from "sso_sign_ins"/);
    await expectIndexed('deleteExpired: sso_sign_ins', signIns, [
      { table: 'sso_sign_ins', index: 'sso_sign_ins_expires' },
      { table: 'sso_sign_ins', index: 'sso_sign_ins_pkey' },
    ]);
    // Batches are deleted by key = any(array(...)): primary-key probes, whatever the table's size
    // (with in (...) the planner read the whole replay store at 200,000 narrow rows).
    const assertions = await statementOf(db(), (d) => deleteExpired(d), /^\s*delete from "saml_assertion_ids"/);
    await expectIndexed('deleteExpired: saml_assertion_ids', assertions, [
      { table: 'saml_assertion_ids', index: 'saml_assertion_ids_expires' },
      { table: 'saml_assertion_ids', index: 'saml_assertion_ids_pkey' },
    ]);
  });

  it("findSession: the session by its hash, its user, and the connection's organization", async () => {
    const query = await firstQueryOf(db(), (d) => findSession(d, 's'.repeat(43)));
    expect(query.sql).toMatch(/left join "sso_connections"/);
    await expectIndexed('findSession', query, [{ table: 'sessions', index: 'sessions_pkey' }]);
  });
});

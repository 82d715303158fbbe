/**
 * Setup links (issue 43, WorkOS's "Admin Portal"): an owner, or the operator, gives a customer's
 * IT admin a link, `<issuer>/setup/<token>`, that lets whoever opens it — signed in, a member or
 * not — set up exactly the link's features in the organization: verify its domains, configure its
 * SSO connections, create its SCIM directories. Nothing else: no membership is made, and the
 * dashboard and the API stay closed to them.
 *
 * The token is 256 random bits, shown once (in the URL) and kept as its SHA-256. Every request
 * through the link looks it up again (findLiveSetupLink): a link is live while it has not expired
 * (at most 30 days, 7 by default), has not been revoked, and whoever made it is still an owner of
 * the organization (an owner removed or demoted takes their links with them; the operator's links
 * stay until they expire or are revoked). Everything done through a link is audited with the
 * acting user and the link's id (audit/events.ts Actor.setupLinkId).
 */
import { sql } from 'kysely';
import { z } from 'zod';
import { type Actor, recordAuditEvent } from '../audit/events.js';
import { type DB, inTransaction } from '../db/connect.js';
import { ConflictError, NotFoundError } from '../errors.js';
import { generateSecret, sha256Hex } from '../lib/crypto.js';
import { parseInput } from '../lib/validate.js';
import { ssoRequiredSql } from '../sso/required.js';
import { builtinRole, type RoleRef } from './roles.js';

export const SETUP_FEATURES = ['domains', 'sso', 'directory'] as const;
export type SetupFeature = (typeof SETUP_FEATURES)[number];

/** What each feature is called on pages and in the CLI's output. */
export const SETUP_FEATURE_NAMES: Readonly<Record<SetupFeature, string>> = {
  domains: 'domain verification',
  sso: 'single sign-on',
  directory: 'directory sync (SCIM)',
};

export const SETUP_PATH = '/setup';
const DAY_S = 24 * 3600;
export const DEFAULT_SETUP_LINK_TTL_S = 7 * DAY_S;
export const MAX_SETUP_LINK_TTL_S = 30 * DAY_S;
export const MIN_SETUP_LINK_TTL_S = 3600;
/** Live links per organization: each is a way in; an organization needs a few at once, not hundreds. */
export const MAX_LIVE_SETUP_LINKS = 20;

/**
 * The role the holder of a link acts with where the SSO rules weigh the actor's role
 * (sso/connections.ts): an admin's, never an owner's. So a connection they make or re-point does
 * not link existing accounts by email without the account's proof, and once people sign in through
 * a connection only an owner may change what it trusts. The setup pages offer no role to choose:
 * what a connection or a directory gives its people stays the organization's default (member).
 */
export const SETUP_LINK_ROLE: RoleRef = builtinRole('admin');

/** A link as owners see it: never its token. */
export interface SetupLinkView {
  id: number;
  organization_id: number;
  features: SetupFeature[];
  created_by_user_id: number | null;
  /** The creator's address; null for the operator's links. */
  created_by_email: string | null;
  created_at: Date;
  expires_at: Date;
  last_used_at: Date | null;
}

/** A live link, as the setup pages use it. */
export interface LiveSetupLink {
  id: number;
  organizationId: number;
  organizationName: string;
  /** The organization requires two-step sign-in of whoever acts in it. */
  requireMfa: boolean;
  features: SetupFeature[];
  expiresAt: Date;
  lastUsedAt: Date | null;
}

const featuresSchema = z
  .array(z.enum(SETUP_FEATURES, { message: `must be among ${SETUP_FEATURES.join(', ')}` }))
  .min(1, 'choose at least one of domains, sso, directory')
  .transform((list) => SETUP_FEATURES.filter((f) => list.includes(f)));

const createSchema = z
  .object({
    features: featuresSchema,
    expires_in: z
      .number()
      .int()
      .min(MIN_SETUP_LINK_TTL_S, 'must be at least an hour')
      .max(MAX_SETUP_LINK_TTL_S, 'must be at most 30 days')
      .optional(),
  })
  .strict();

/** `7d`, `36h`: a link's lifetime in seconds; undefined when `text` is not one. */
export function parseLifetime(text: string): number | undefined {
  const match = /^([1-9][0-9]{0,3})([dh])$/.exec(text.trim());
  if (!match) return undefined;
  return Number(match[1]) * (match[2] === 'd' ? DAY_S : 3600);
}

export function setupLinkUrl(issuer: string, token: string): string {
  return `${issuer}${SETUP_PATH}/${token}`;
}

/** Whether `token` looks like one (43 base64url characters): anything else is not looked up. */
function wellFormedToken(token: string): boolean {
  return /^[A-Za-z0-9_-]{43}$/.test(token);
}

/** The links of an organization that still work: not expired, not revoked, their creator still an owner (or the operator's). */
function liveLinks(db: DB) {
  return db
    .selectFrom('setup_links')
    .where('setup_links.revoked_at', 'is', null)
    .where('setup_links.expires_at', '>', sql<Date>`now()`)
    .where((eb) =>
      eb.or([
        eb('setup_links.created_by_user_id', 'is', null),
        eb.exists(
          eb
            .selectFrom('memberships')
            .select('memberships.user_id')
            .whereRef('memberships.organization_id', '=', 'setup_links.organization_id')
            .whereRef('memberships.user_id', '=', 'setup_links.created_by_user_id')
            .where('memberships.role', '=', 'owner'),
        ),
      ]),
    );
}

const features = (stored: string[]): SetupFeature[] => SETUP_FEATURES.filter((f) => stored.includes(f));

/**
 * Makes a link; its token (and so its URL) is in this answer only. `by.userId`: the owner making
 * it (the caller checked they are one); null for the operator.
 */
export async function createSetupLink(
  db: DB,
  organizationId: number,
  input: { features: readonly string[]; expires_in?: number | undefined },
  by: { userId: number | null },
): Promise<{ link: SetupLinkView; token: string }> {
  const fields = parseInput(createSchema, { features: [...input.features], ...(input.expires_in === undefined ? {} : { expires_in: input.expires_in }) });
  const token = generateSecret(32);
  const id = await inTransaction(db, async (trx) => {
    // The organization's row, locked: two creations at once cannot both pass the count.
    const organization = await trx.selectFrom('organizations').select('id').where('id', '=', organizationId).forNoKeyUpdate().executeTakeFirst();
    if (!organization) throw new NotFoundError(`organization ${organizationId} not found`);
    const { count } = await liveLinks(trx)
      .where('setup_links.organization_id', '=', organizationId)
      .select((eb) => eb.fn.countAll<number>().as('count'))
      .executeTakeFirstOrThrow();
    if (Number(count) >= MAX_LIVE_SETUP_LINKS) throw new ConflictError(`an organization may have at most ${MAX_LIVE_SETUP_LINKS} live setup links; revoke one first`);
    const row = await trx
      .insertInto('setup_links')
      .values({
        organization_id: organizationId,
        features: fields.features,
        token_hash: sha256Hex(token),
        created_by_user_id: by.userId,
        // The database's clock, as the check constraint's (at most 30 days after created_at).
        expires_at: sql<Date>`now() + make_interval(secs => ${fields.expires_in ?? DEFAULT_SETUP_LINK_TTL_S})`,
      })
      .returning(['id', 'expires_at'])
      .executeTakeFirstOrThrow();
    await recordAuditEvent(trx, {
      organizationId,
      action: 'setup_link.created',
      actor: { actorUserId: by.userId },
      details: { setup_link_id: row.id, features: fields.features, expires_at: row.expires_at.toISOString() },
    });
    return row.id;
  });
  const link = (await listSetupLinks(db, organizationId)).find((l) => l.id === id);
  if (!link) throw new NotFoundError('setup link not found');
  return { link, token };
}

/** The organization's live links, newest first. */
export async function listSetupLinks(db: DB, organizationId: number): Promise<SetupLinkView[]> {
  const rows = await liveLinks(db)
    .leftJoin('users', 'users.id', 'setup_links.created_by_user_id')
    .select([
      'setup_links.id',
      'setup_links.organization_id',
      'setup_links.features',
      'setup_links.created_by_user_id',
      'users.email as created_by_email',
      'setup_links.created_at',
      'setup_links.expires_at',
      'setup_links.last_used_at',
    ])
    .where('setup_links.organization_id', '=', organizationId)
    .orderBy('setup_links.id', 'desc')
    .limit(MAX_LIVE_SETUP_LINKS)
    .execute();
  return rows.map((r) => ({ ...r, features: features(r.features) }));
}

/** Ends a live link at once (the next request through it is refused); NotFoundError when the organization has no such live link. */
export async function revokeSetupLink(db: DB, organizationId: number, id: number, actor?: Actor): Promise<void> {
  await inTransaction(db, async (trx) => {
    const row = await trx
      .updateTable('setup_links')
      .set({ revoked_at: sql<Date>`now()` })
      .where('organization_id', '=', organizationId)
      .where('id', '=', id)
      .where('revoked_at', 'is', null)
      .where('expires_at', '>', sql<Date>`now()`)
      .returning('features')
      .executeTakeFirst();
    if (!row) throw new NotFoundError('no such live setup link in this organization');
    await recordAuditEvent(trx, { organizationId, action: 'setup_link.revoked', actor, details: { setup_link_id: id, features: features(row.features) } });
  });
}

/** The live link whose token is `token`, with its organization; undefined for any other token (unknown, expired, revoked, its creator no longer an owner). */
export async function findLiveSetupLink(db: DB, token: string): Promise<LiveSetupLink | undefined> {
  if (!wellFormedToken(token)) return undefined;
  const row = await liveLinks(db)
    .innerJoin('organizations', 'organizations.id', 'setup_links.organization_id')
    .select(['setup_links.id', 'setup_links.organization_id', 'organizations.name', 'organizations.require_mfa', 'setup_links.features', 'setup_links.expires_at', 'setup_links.last_used_at'])
    .where('setup_links.token_hash', '=', sha256Hex(token))
    .executeTakeFirst();
  if (!row) return undefined;
  return {
    id: row.id,
    organizationId: row.organization_id,
    organizationName: row.name,
    requireMfa: row.require_mfa,
    features: features(row.features),
    expiresAt: row.expires_at,
    lastUsedAt: row.last_used_at,
  };
}

/** last_used_at is written at most this often per link: a page view is not a write. */
const TOUCH_EVERY_MS = 60_000;

/**
 * Notes that a signed-in user is using the link. Its first use is audited (`setup_link.opened`,
 * with the user): owners learn who took up the link they sent.
 */
export async function touchSetupLink(db: DB, link: LiveSetupLink, userId: number): Promise<void> {
  if (link.lastUsedAt !== null && Date.now() - link.lastUsedAt.getTime() < TOUCH_EVERY_MS) return;
  await inTransaction(db, async (trx) => {
    const first = await trx.updateTable('setup_links').set({ last_used_at: sql<Date>`now()` }).where('id', '=', link.id).where('last_used_at', 'is', null).returning('id').executeTakeFirst();
    if (first) {
      await recordAuditEvent(trx, { organizationId: link.organizationId, action: 'setup_link.opened', actor: { actorUserId: userId, setupLinkId: link.id }, details: {} });
      return;
    }
    await trx.updateTable('setup_links').set({ last_used_at: sql<Date>`now()` }).where('id', '=', link.id).execute();
  });
}

/** Whether the link's organization requires the person at `email` to sign in through its identity provider (SS-4, sso/required.ts). */
export async function ssoRequiredFor(db: DB, organizationId: number, email: string): Promise<boolean> {
  const { rows } = await sql<{ required: boolean }>`select ${ssoRequiredSql(sql.val(organizationId), sql.val(email))} as required`.execute(db);
  return rows[0]?.required === true;
}

/**
 * The Overview (/dashboard): the current organization's activity over the last 30 days (from the
 * per-day counters, src/activity.ts), today's totals, how many members, invitations,
 * applications and live grants it has, what needs attention, and for a new organization a
 * first-run checklist that ticks itself from real state. Every query here is bounded by the
 * organization's counters, a LIMIT or an index range: the page costs the same with a million
 * grants and a million audit events as with none (bench: "Overview").
 */
import type { FastifyInstance } from 'fastify';
import { sql } from 'kysely';
import { ACTIVITY_METRICS, type ActivityMetric, everCounted, readActivity, utcDay } from '../../activity.js';
import type { Config } from '../../config.js';
import type { DB } from '../../db/connect.js';
import { barChart, type ChartSeries } from '../charts.js';
import { GRANT_COUNT_CAP } from '../../oauth/models/grants.js';
import { renderPage } from '../render.js';
import { redirectWithNotice } from './notice.js';
import type { DashboardDeps } from './applications.js';
import { type DashboardContext, dashboardContext, readForm, requireAction } from './context.js';

const DAYS = 30;
/** Invitations expiring within this many hours are shown as needing attention. */
const EXPIRING_HOURS = 48;
/** An application younger than this is not "never used" yet. */
const UNUSED_AFTER_HOURS = 24;

const TOKEN_SERIES: ChartSeries[] = [
  { key: 'tokens_authorization_code', label: 'authorization code', color: '#0969da' },
  { key: 'tokens_refresh_token', label: 'refresh token', color: '#54aeff' },
  { key: 'tokens_client_credentials', label: 'client credentials', color: '#8250df' },
  { key: 'tokens_device_code', label: 'device code', color: '#bf3989' },
  { key: 'tokens_dashboard', label: 'Generate Token', color: '#9a6700' },
  { key: 'tokens_cli', label: 'CLI', color: '#57606a' },
];

/** The Overview's charts: which counters each stacks, in order. */
export const CHARTS: { id: string; title: string; unit: string; series: ChartSeries[] }[] = [
  { id: 'chart-sign-ins', title: 'Sign-ins', unit: 'sign-ins', series: [{ key: 'sign_ins', label: 'sign-ins', color: '#1f883d' }] },
  { id: 'chart-consents', title: 'Authorizations (consents)', unit: 'authorizations', series: [{ key: 'consents', label: 'authorizations', color: '#0969da' }] },
  { id: 'chart-tokens', title: 'Tokens issued, by grant type', unit: 'tokens', series: TOKEN_SERIES },
  {
    id: 'chart-api',
    title: 'API requests',
    unit: 'API requests',
    series: [
      { key: 'api_2xx', label: '2xx', color: '#1f883d' },
      { key: 'api_4xx', label: '4xx', color: '#9a6700' },
      { key: 'api_5xx', label: '5xx', color: '#cf222e' },
    ],
  },
  { id: 'chart-refused', title: 'Refused tokens', unit: 'refused tokens', series: [{ key: 'api_refused', label: 'refused tokens', color: '#cf222e' }] },
];

/** `count(*)` of at most GRANT_COUNT_CAP + 1 rows of `from`: exact below the cap, "more than" above. */
async function cappedCount(db: DB, from: ReturnType<typeof sql>): Promise<number> {
  const { rows } = await sql<{ n: number }>`select count(*)::int as n from (${from} limit ${GRANT_COUNT_CAP + 1}) capped`.execute(db);
  return Number(rows[0]?.n ?? 0);
}

export interface AttentionItem {
  text: string;
  href: string;
  link: string;
}

async function counts(db: DB, ctx: DashboardContext, organizationId: number) {
  const { can } = ctx;
  const pending = sql`select 1 from invitations where organization_id = ${organizationId} and accepted_at is null and revoked_at is null and expires_at > now()`;
  return {
    members: can['members.read'] ? await cappedCount(db, sql`select 1 from memberships where organization_id = ${organizationId}`) : undefined,
    invitations: can['members.read'] ? await cappedCount(db, pending) : undefined,
    applications: can['applications.read']
      ? await cappedCount(db, sql`select 1 from applications where organization_id = ${organizationId} and deleted_at is null`)
      : undefined,
    grants: can['grants.read'] ? await cappedCount(db, sql`select 1 from grants where organization_id = ${organizationId} and revoked_at is null`) : undefined,
  };
}

async function attention(db: DB, config: Config, ctx: DashboardContext, organizationId: number): Promise<AttentionItem[]> {
  const items: AttentionItem[] = [];
  if (ctx.can['members.write']) {
    const expiring = await db
      .selectFrom('invitations')
      .select(['email', 'expires_at'])
      .where('organization_id', '=', organizationId)
      .where('accepted_at', 'is', null)
      .where('revoked_at', 'is', null)
      .where('expires_at', '>', sql<Date>`now()`)
      .where('expires_at', '<', sql<Date>`now() + make_interval(hours => ${EXPIRING_HOURS})`)
      .orderBy('expires_at')
      .limit(5)
      .execute();
    for (const i of expiring) {
      const hours = Math.max(1, Math.round((i.expires_at.getTime() - Date.now()) / 3_600_000));
      items.push({ text: `The invitation to ${i.email} expires in ${hours} hour${hours === 1 ? '' : 's'}.`, href: '/dashboard/members', link: 'Resend it' });
    }
  }
  if (ctx.can['applications.read']) {
    const unused = await db
      .selectFrom('applications as a')
      .select(['a.name', 'a.client_id'])
      .where('a.organization_id', '=', organizationId)
      .where('a.deleted_at', 'is', null)
      .where('a.disabled', '=', false)
      .where('a.created_at', '<', sql<Date>`now() - make_interval(hours => ${UNUSED_AFTER_HOURS})`)
      .where('a.first_used_at', 'is', null)
      .orderBy('a.id')
      .limit(5)
      .execute();
    for (const a of unused) {
      items.push({ text: `${a.name} has never been used: no token was ever issued to it.`, href: `/dashboard/applications/${encodeURIComponent(a.client_id)}`, link: 'Open it' });
    }
  }
  if (ctx.organization?.role === 'owner' && config.signingKeyRotationDays > 0) {
    const old = await db
      .selectFrom('signing_keys')
      .select(['alg', 'created_at'])
      .where('retired_at', 'is', null)
      .where('created_at', '<', sql<Date>`now() - make_interval(days => ${config.signingKeyRotationDays})`)
      .orderBy('alg')
      .execute();
    for (const k of old) {
      const days = Math.floor((Date.now() - k.created_at.getTime()) / 86_400_000);
      items.push({
        text: `The server's ${k.alg} signing key is ${days} days old (the policy is ${config.signingKeyRotationDays}): ask the operator to run \`orgauth keys rotate --alg ${k.alg}\`.`,
        href: '/.well-known/jwks.json',
        link: 'Published keys',
      });
    }
  }
  if (ctx.can['webhooks.read']) {
    const failing = await db
      .selectFrom('webhook_endpoints')
      .select(['id', 'url', 'enabled', 'disabled_reason', 'failing_since'])
      .where('organization_id', '=', organizationId)
      .where((eb) => eb.or([eb('failing_since', 'is not', null), eb.and([eb('enabled', '=', false), eb('disabled_reason', 'is not', null)])]))
      .orderBy('id')
      .limit(5)
      .execute();
    for (const w of failing) {
      const text = !w.enabled
        ? `The webhook to ${w.url} was turned off: ${w.disabled_reason}.`
        : `The webhook to ${w.url} has been failing since ${w.failing_since!.toISOString().slice(0, 16).replace('T', ' ')} UTC.`;
      items.push({ text, href: `/dashboard/webhooks#endpoint-${w.id}`, link: "See its deliveries" });
    }
  }
  return items;
}

export interface ChecklistStep {
  done: boolean;
  title: string;
  href: string;
  link: string;
  curl?: string;
}

async function checklist(db: DB, config: Config, organizationId: number, n: Awaited<ReturnType<typeof counts>>): Promise<ChecklistStep[]> {
  const tokenMetrics = ACTIVITY_METRICS.filter((m) => m.startsWith('tokens_'));
  const ever = await everCounted(db, organizationId, [...tokenMetrics, 'api_2xx'] as ActivityMetric[]);
  const anyGrant = await db.selectFrom('grants').select('id').where('organization_id', '=', organizationId).limit(1).executeTakeFirst();
  const members = n.members ?? 0;
  const base = config.issuer;
  return [
    { done: (n.applications ?? 0) > 0, title: 'Create an application', href: '/dashboard/applications', link: 'Applications' },
    {
      done: anyGrant !== undefined || tokenMetrics.some((m) => ever.has(m)),
      title: 'Get a first token: "Generate Token" on a private application, or a first authorization of a public one',
      href: '/dashboard/applications',
      link: 'Applications',
      curl: `curl -u "$CLIENT_ID:$CLIENT_SECRET" -d grant_type=client_credentials -d organization_id=${organizationId} -d scope=contacts.read ${base}/oauth/token`,
    },
    {
      done: ever.has('api_2xx'),
      title: 'Make a first API call',
      href: `${base}/docs`,
      link: 'API reference',
      curl: `curl -H "Authorization: Bearer $ACCESS_TOKEN" -H "Accept: application/json" ${base}/api/v1/${organizationId}/contacts`,
    },
    { done: members > 1 || (n.invitations ?? 0) > 0, title: 'Invite a teammate', href: '/dashboard/members', link: 'Members' },
  ];
}

export async function overviewRoutes(app: FastifyInstance, deps: DashboardDeps): Promise<void> {
  const { db, config } = deps;

  app.get('/dashboard', async (req, reply) => {
    const ctx = dashboardContext(req);
    const org = ctx.organization;
    if (!org) return renderPage(reply, 200, 'dashboard/overview', { title: 'Overview', ctx, active: 'overview', charts: [], today: '', n: {}, attention: [], steps: [] });
    const today = utcDay();
    const from = utcDay(new Date(Date.parse(`${today}T00:00:00Z`) - (DAYS - 1) * 86_400_000));
    const series = ctx.can['audit.read'] ? await readActivity(db, org.id, from, today) : undefined;
    const charts = series
      ? CHARTS.map((c) => ({
          ...c,
          svg: barChart({ ...c, days: series.days }),
          today: c.series.reduce((sum, s) => sum + (series.days.at(-1)!.counts[s.key as ActivityMetric] ?? 0), 0),
          total: c.series.reduce((sum, s) => sum + (series.totals[s.key as ActivityMetric] ?? 0), 0),
          todayBySeries: c.series.map((s) => ({ ...s, count: series.days.at(-1)!.counts[s.key as ActivityMetric] ?? 0 })),
          days: series.days,
        }))
      : [];
    const n = await counts(db, ctx, org.id);
    const dismissed = (await db.selectFrom('organizations').select('checklist_dismissed_at').where('id', '=', org.id).executeTakeFirst())?.checklist_dismissed_at;
    const steps = ctx.can['applications.write'] && !dismissed ? await checklist(db, config, org.id, n) : [];
    return renderPage(reply, 200, 'dashboard/overview', {
      title: 'Overview',
      ctx,
      active: 'overview',
      charts,
      today,
      from,
      n,
      cap: GRANT_COUNT_CAP,
      attention: await attention(db, config, ctx, org.id),
      steps: steps.every((s) => s.done) ? [] : steps,
    });
  });

  // Puts the first-run checklist away for the whole organization.
  app.post('/dashboard/checklist/dismiss', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: 'applications.write' });
    await db.updateTable('organizations').set({ checklist_dismissed_at: sql`coalesce(checklist_dismissed_at, now())` }).where('id', '=', ctx.organization.id).execute();
    return redirectWithNotice(reply, config, ctx.session.sessionId, '/dashboard', `The first-run checklist is put away for everyone in ${ctx.organization.name}.`);
  });
}

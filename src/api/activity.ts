/** GET /activity: the organization's activity per UTC day, the series the dashboard's Overview draws. */
import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { ACTIVITY_METRICS, readActivity, utcDay } from '../activity.js';
import type { DB } from '../db/connect.js';
import { InvalidRequestError } from '../errors.js';
import { authOf } from './auth.js';
import { errorResponses, orgParams } from './schemas.js';

/** The longest range one request may ask for, in days. */
export const MAX_ACTIVITY_DAYS = 366;
const DAY_MS = 86_400_000;

const dayParam = z
  .string()
  .regex(/^\d{4}-\d{2}-\d{2}$/, 'must be a date, YYYY-MM-DD')
  .refine((v) => {
    const t = Date.parse(`${v}T00:00:00Z`);
    return Number.isFinite(t) && utcDay(new Date(t)) === v;
  }, 'must be a real date, YYYY-MM-DD');

const countsSchema = z.object(Object.fromEntries(ACTIVITY_METRICS.map((m) => [m, z.number().int()])) as Record<(typeof ACTIVITY_METRICS)[number], z.ZodNumber>);

const activitySchema = z
  .object({
    from: z.string().describe('the first day, UTC'),
    to: z.string().describe('the last day, UTC (inclusive)'),
    metrics: z.array(z.string()).describe('every metric, in the order the dashboard draws them'),
    totals: countsSchema.describe('each metric summed over the days'),
    days: z.array(z.object({ day: z.string(), counts: countsSchema })).describe('one entry per day from `from` to `to`, zeros included'),
  })
  .describe(
    'Counts per UTC day: sign_ins (completed sign-ins of members), consents (authorizations approved, browser and device), ' +
      'tokens_<grant> (access tokens issued: authorization_code, refresh_token, client_credentials, device_code, dashboard, cli), ' +
      'api_2xx / api_4xx / api_5xx (API answers for this organization by class) and api_refused (API requests whose token was refused: ' +
      'invalid, expired, revoked, for another organization, or short of scope). Each instance writes its counts every ACTIVITY_FLUSH_INTERVAL seconds.',
  )
  .meta({ id: 'Activity' });

export const activityRoutes: FastifyPluginAsyncZod<{ db: DB }> = async (app, { db }) => {
  app.get(
    '/activity',
    {
      config: { scope: 'audit.read' },
      schema: {
        tags: ['organization'],
        summary: "The organization's activity per day (the last 30 days unless from/to say otherwise; at most 366 days)",
        params: orgParams,
        querystring: z.object({
          from: dayParam.optional().describe('first day, YYYY-MM-DD (UTC); default: 29 days before `to`'),
          to: dayParam.optional().describe('last day, YYYY-MM-DD (UTC), inclusive; default: today'),
        }),
        response: { 200: activitySchema, ...errorResponses },
      },
    },
    async (req) => {
      const to = req.query.to ?? utcDay();
      const from = req.query.from ?? utcDay(new Date(Date.parse(`${to}T00:00:00Z`) - 29 * DAY_MS));
      const span = (Date.parse(`${to}T00:00:00Z`) - Date.parse(`${from}T00:00:00Z`)) / DAY_MS + 1;
      if (span < 1) throw new InvalidRequestError('from must not be after to');
      if (span > MAX_ACTIVITY_DAYS) throw new InvalidRequestError(`at most ${MAX_ACTIVITY_DAYS} days at once`);
      const series = await readActivity(db, authOf(req).organizationId, from, to);
      return { from, to, metrics: [...ACTIVITY_METRICS], totals: series.totals, days: series.days };
    },
  );
};

/**
 * The management API's domains: the email domains the organization claims for single sign-on.
 * A claim is pending until the TXT record `_orgauth-challenge.<domain>` holds its token and
 * POST /domains/:domain/verify finds it; only a verified domain routes anyone to the
 * organization's identity provider or requires SSO of them. sso.read lists and reads them,
 * sso.write claims, verifies, changes and deletes them. The rules are the domain layer's
 * (src/sso/domains.ts), shared with the dashboard and the CLI.
 */
import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import type { Config } from '../config.js';
import type { DB } from '../db/connect.js';
import { addDomain, CHALLENGE_PREFIX, deleteDomain, type DomainView, getDomain, listDomains, MAX_DOMAINS, txtLookup, updateDomain, verifyDomain } from '../sso/domains.js';
import { actorOf, authOf } from './auth.js';
import { errorResponses, errorSchema, orgParams } from './schemas.js';

export const domainSchema = z
  .object({
    id: z.number().int(),
    domain: z.string().describe('lower case, ASCII (an internationalized domain in its xn-- form)'),
    state: z.enum(['pending', 'verified']).describe('only a verified domain routes sign-ins to the organization’s identity providers'),
    sso_required: z.boolean().describe('whether people with addresses at the domain must sign in through SSO (no password); effective once verified and a connection is active'),
    verification: z
      .object({
        type: z.literal('TXT'),
        name: z.string().describe(`the record’s name: ${CHALLENGE_PREFIX}.<domain>`),
        value: z.string().describe('the token the record must hold'),
      })
      .describe('the DNS record that proves the organization controls the domain'),
    verified_at: z.iso.datetime().nullable(),
    checked_at: z.iso.datetime().nullable().describe('the last verification attempt'),
    created_at: z.iso.datetime(),
  })
  .meta({ id: 'Domain' });

export function domainOut(d: DomainView): z.infer<typeof domainSchema> {
  return {
    id: d.id,
    domain: d.domain,
    state: d.state,
    sso_required: d.sso_required,
    verification: { type: d.verification.type, name: d.verification.name, value: d.verification.value },
    verified_at: d.verified_at?.toISOString() ?? null,
    checked_at: d.checked_at?.toISOString() ?? null,
    created_at: d.created_at.toISOString(),
  };
}

const domainParams = orgParams.extend({ domain: z.string().max(253) });
const domainConflict = { 409: errorSchema.describe('refused: the domain is verified by another organization, or already claimed by this one') };

export const domainRoutes: FastifyPluginAsyncZod<{ db: DB; config: Config }> = async (app, { db, config }) => {
  const lookup = txtLookup(config.dnsServers);

  app.get(
    '/domains',
    {
      config: { scope: 'sso.read' },
      schema: {
        tags: ['sso'],
        summary: `List the organization’s domains, by name (at most ${MAX_DOMAINS}, so all in one page)`,
        params: orgParams,
        response: { 200: z.object({ data: z.array(domainSchema) }), ...errorResponses },
      },
    },
    async (req) => ({ data: (await listDomains(db, authOf(req).organizationId)).map(domainOut) }),
  );

  app.get(
    '/domains/:domain',
    {
      config: { scope: 'sso.read' },
      schema: { tags: ['sso'], summary: 'Get a domain', params: domainParams, response: { 200: domainSchema, ...errorResponses } },
    },
    async (req) => domainOut(await getDomain(db, authOf(req).organizationId, req.params.domain)),
  );

  app.post(
    '/domains',
    {
      config: { scope: 'sso.write' },
      schema: {
        tags: ['sso'],
        summary:
          'Claim a domain: it is pending until its TXT record is published and verified. Public mail services (gmail.com, …) are refused; pending claims of several organizations coexist',
        params: orgParams,
        body: z.strictObject({ domain: z.string().max(1000) }),
        response: { 201: domainSchema, ...errorResponses, ...domainConflict },
      },
    },
    async (req, reply) => {
      const auth = authOf(req);
      const domain = await addDomain(db, auth.organizationId, { domain: req.body.domain }, actorOf(auth));
      reply.code(201).header('location', `/api/v1/${auth.organizationId}/domains/${encodeURIComponent(domain.domain)}`);
      return domainOut(domain);
    },
  );

  app.post(
    '/domains/:domain/verify',
    {
      config: { scope: 'sso.write' },
      schema: {
        tags: ['sso'],
        summary:
          'Look the domain’s TXT record up now; when it holds the token, the domain is verified (a verified domain answers as it is). No record or another value: 400, saying what was looked for',
        params: domainParams,
        response: { 200: domainSchema, ...errorResponses, 409: errorSchema.describe('refused: another organization verified the domain first') },
      },
    },
    async (req) => {
      const auth = authOf(req);
      return domainOut(await verifyDomain(db, lookup, auth.organizationId, req.params.domain, actorOf(auth)));
    },
  );

  app.patch(
    '/domains/:domain',
    {
      config: { scope: 'sso.write' },
      schema: {
        tags: ['sso'],
        summary: 'Require SSO of the people at the domain, or stop requiring it',
        params: domainParams,
        body: z.strictObject({ sso_required: z.boolean().optional() }),
        response: { 200: domainSchema, ...errorResponses },
      },
    },
    async (req) => {
      const auth = authOf(req);
      return domainOut(await updateDomain(db, auth.organizationId, req.params.domain, { sso_required: req.body.sso_required }, actorOf(auth)));
    },
  );

  app.delete(
    '/domains/:domain',
    {
      config: { scope: 'sso.write' },
      schema: {
        tags: ['sso'],
        summary: 'Give up a domain: its people sign in as anyone else again (their accounts and identity links stay)',
        params: domainParams,
        response: { 204: z.null().describe('deleted'), ...errorResponses },
      },
    },
    async (req, reply) => {
      const auth = authOf(req);
      await deleteDomain(db, auth.organizationId, req.params.domain, actorOf(auth));
      return reply.code(204).send(null);
    },
  );
};

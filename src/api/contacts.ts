/** Contacts: the repository (every function takes the organization id first) and the routes. */
import { sql } from 'kysely';
import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { recordAuditEvent } from '../audit/events.js';
import type { DB } from '../db/connect.js';
import type { Contact } from '../db/schema.js';
import { NotFoundError } from '../errors.js';
import { actorOf, authOf, pathId } from './auth.js';
import { decodeCursor, listQuery, page } from './pagination.js';
import { errorResponses, idParams, listOf, orgParams } from './schemas.js';

/** PostgreSQL text cannot hold NUL: refuse it here (400) rather than fail in the database. */
export const text = (max: number) =>
  z
    .string()
    .trim()
    .max(max)
    .refine((v) => !v.includes('\u0000'), 'must not contain NUL characters');
const nullableText = (max: number) => text(max).nullable().optional().transform((v) => (v === '' ? null : v));

export const contactSchema = z
  .object({
    id: z.number().int(),
    name: z.string(),
    email: z.string().nullable(),
    phone: z.string().nullable(),
    company: z.string().nullable(),
    notes: z.string().nullable(),
    created_at: z.iso.datetime(),
    updated_at: z.iso.datetime(),
  })
  .meta({ id: 'Contact' });

const contactFields = {
  name: text(200).min(1, 'must not be empty'),
  email: z.union([z.email().max(254), z.literal(''), z.null()]).optional().transform((v) => (v === '' ? null : v)),
  phone: nullableText(50),
  company: nullableText(200),
  notes: nullableText(10_000),
};
const newContactSchema = z.strictObject(contactFields);
const contactPatchSchema = z
  .strictObject({ ...contactFields, name: contactFields.name.optional() })
  .refine((v) => Object.keys(v).length > 0, 'send at least one field');

/** The fields that leave the server. */
export function contactOut(c: Contact): z.infer<typeof contactSchema> {
  return {
    id: c.id,
    name: c.name,
    email: c.email,
    phone: c.phone,
    company: c.company,
    notes: c.notes,
    created_at: c.created_at.toISOString(),
    updated_at: c.updated_at.toISOString(),
  };
}

export async function listContacts(db: DB, organizationId: number, options: { afterId: number; limit: number; q?: string | undefined }) {
  let query = db.selectFrom('contacts').selectAll().where('organization_id', '=', organizationId).where('id', '>', options.afterId);
  if (options.q) {
    const pattern = `%${options.q.replace(/[\\%_]/g, (c) => `\\${c}`)}%`;
    query = query.where((eb) => eb.or([eb('name', 'ilike', pattern), eb('email', 'ilike', pattern), eb('company', 'ilike', pattern)]));
  }
  return query.orderBy('id').limit(options.limit + 1).execute();
}

export async function getContact(db: DB, organizationId: number, id: number): Promise<Contact> {
  const contact = await db.selectFrom('contacts').selectAll().where('organization_id', '=', organizationId).where('id', '=', id).executeTakeFirst();
  if (!contact) throw new NotFoundError('no such contact');
  return contact;
}

export const contactRoutes: FastifyPluginAsyncZod<{ db: DB }> = async (app, { db }) => {

  app.get(
    '/contacts',
    {
      config: { scope: 'contacts.read' },
      schema: {
        tags: ['contacts'],
        summary: 'List contacts',
        params: orgParams,
        querystring: z.object({ ...listQuery, q: text(200).optional().describe('matches name, email or company, case-insensitively') }),
        response: { 200: listOf(contactSchema), ...errorResponses },
      },
    },
    async (req) => {
      const { organizationId } = authOf(req);
      const rows = await listContacts(db, organizationId, { afterId: decodeCursor(req.query.cursor), limit: req.query.limit, q: req.query.q });
      const result = page(rows, req.query.limit, (c) => c.id);
      return { data: result.rows.map(contactOut), next_cursor: result.next_cursor };
    },
  );

  app.post(
    '/contacts',
    {
      config: { scope: 'contacts.write' },
      schema: { tags: ['contacts'], summary: 'Create a contact', params: orgParams, body: newContactSchema, response: { 201: contactSchema, ...errorResponses } },
    },
    async (req, reply) => {
      const { organizationId } = authOf(req);
      const b = req.body;
      const contact = await db
        .insertInto('contacts')
        .values({ organization_id: organizationId, name: b.name, email: b.email ?? null, phone: b.phone ?? null, company: b.company ?? null, notes: b.notes ?? null })
        .returningAll()
        .executeTakeFirstOrThrow();
      reply.code(201).header('location', `/api/v1/${organizationId}/contacts/${contact.id}`);
      return contactOut(contact);
    },
  );

  app.get(
    '/contacts/:id',
    {
      config: { scope: 'contacts.read' },
      schema: { tags: ['contacts'], summary: 'Get a contact', params: idParams, response: { 200: contactSchema, ...errorResponses } },
    },
    async (req) => contactOut(await getContact(db, authOf(req).organizationId, pathId(req.params.id))),
  );

  app.patch(
    '/contacts/:id',
    {
      config: { scope: 'contacts.write' },
      schema: { tags: ['contacts'], summary: 'Change a contact', params: idParams, body: contactPatchSchema, response: { 200: contactSchema, ...errorResponses } },
    },
    async (req) => {
      const { organizationId } = authOf(req);
      const contact = await db
        .updateTable('contacts')
        .set({ ...req.body, updated_at: sql`now()` })
        .where('organization_id', '=', organizationId)
        .where('id', '=', pathId(req.params.id))
        .returningAll()
        .executeTakeFirst();
      if (!contact) throw new NotFoundError('no such contact');
      return contactOut(contact);
    },
  );

  app.delete(
    '/contacts/:id',
    {
      config: { scope: 'contacts.write' },
      schema: { tags: ['contacts'], summary: 'Delete a contact', params: idParams, response: { 204: z.null().describe('deleted'), ...errorResponses } },
    },
    async (req, reply) => {
      const auth = authOf(req);
      const deleted = await db
        .deleteFrom('contacts')
        .where('organization_id', '=', auth.organizationId)
        .where('id', '=', pathId(req.params.id))
        .returning(['id', 'name'])
        .executeTakeFirst();
      if (!deleted) throw new NotFoundError('no such contact');
      await recordAuditEvent(db, {
        organizationId: auth.organizationId,
        action: 'contact.deleted',
        actor: actorOf(auth),
        details: { contact_id: deleted.id, name: deleted.name },
      });
      return reply.code(204).send(null);
    },
  );
};

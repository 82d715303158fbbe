/** Contacts: the repository (every function takes the organization id first) and the routes. */
import { sql } from 'kysely';
import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { recordAuditEvent } from '../audit/events.js';
import { type DB, prepared } from '../db/connect.js';
import type { Contact } from '../db/schema.js';
import { NotFoundError } from '../errors.js';
import { actorOf, authOf, pathId } from './auth.js';
import { decodeCursor, listPage, listQuery } from './pagination.js';
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

/**
 * Contact search: a case-insensitive substring of name, email or company, in id order, a page at
 * a time. Whatever the term and however large the organization, a page costs a bounded amount of
 * work (issue 13): a plain `ILIKE` filter on the id-ordered scan is cheap for a common term but
 * walks the whole organization for a rare or absent one, and the trigram index finds rare terms
 * at once but must sort every match of a common one. The planner picks between the two from
 * statistics of the whole table, which say nothing about one organization (a term common in
 * others and absent here walked a million rows for 2 s), so the choice is made here, in steps:
 *
 * 1. Walk the next SEARCH_WALK rows in id order (one index range) and filter them: a common term
 *    fills its page here.
 * 2. Otherwise ask the trigram index (only bitmap scans allowed: no walk of the organization)
 *    for up to 1,000 matches beyond the walk, unordered. Fewer than that: they are all the
 *    matches there are, and the page is the smallest of them.
 * 3. Otherwise the page ends at or before the `need`-th smallest id the probe saw; read just
 *    that id range, ordered, through whichever index the range makes cheaper.
 *
 * The probe is the function contacts_search_probe (migration 0009), whose SET clauses allow only
 * bitmap scans: an absent term costs the walk and one more statement.
 *
 * Terms must hold a trigram (searchable() below): one that has none ("ab", "--") cannot use the
 * index and would read it whole.
 */
const SEARCH_WALK = 100;
/** As many ids as contacts_search_probe returns at most. */
const SEARCH_PROBE = 1000;

/** Whether pg_trgm extracts at least one trigram from `%term%` (see its generate_wildcard_trgm). */
export function searchable(term: string): boolean {
  const words = [...term.matchAll(/[\p{L}\p{N}]+/gu)];
  return words.some((word) => {
    // Padded with two blanks before and one after, except where the wildcard touches the word.
    const before = word.index > 0 ? 2 : 0;
    const after = word.index + word[0].length < term.length ? 1 : 0;
    return [...word[0]].length + before + after >= 3;
  });
}

/** Up to `limit` contacts after `afterId` in id order, those matching `q` if given (the API asks for a page plus one). */
export async function listContacts(db: DB, organizationId: number, options: { afterId: number; limit: number; q?: string | undefined }): Promise<Contact[]> {
  if (options.q) return searchContacts(db, organizationId, options.afterId, options.limit, options.q);
  return db.selectFrom('contacts').selectAll().where(organizationRowsAfter(organizationId, options.afterId)).orderBy('organization_id').orderBy('id').limit(options.limit).execute();
}

/**
 * An organization's rows after `afterId`, written as a range of the (organization_id, id) index
 * and read in that index's order. With `organization_id = $1 and id > $2 order by id` the
 * planner may read the primary key instead when the organization holds most of the table, and
 * then walks past every other organization's rows below the cursor first (the first page of the
 * bench's million-contact organization read the other one's 10,000 rows: 2.1 ms instead of 0.9).
 * A range of the pair cannot be read off the primary key in that order.
 */
const organizationRowsAfter = (organizationId: number, afterId: number) =>
  sql<boolean>`(organization_id, id) > (${organizationId}, ${afterId}) and (organization_id, id) <= (${organizationId}, 9223372036854775807)`;

type Walked = Contact & { walked: number; last_id: number | null };

async function searchContacts(db: DB, organizationId: number, afterId: number, limit: number, term: string): Promise<Contact[]> {
  const pattern = `%${term.replace(/[\\%_]/g, (c) => `\\${c}`)}%`;
  // 1. The walk, and where it ended (a contact's columns are null when none of the walked rows matched).
  const { rows } = await sql<Walked>`${prepared('contacts_search_walk')}with walk as (
      select * from contacts where ${organizationRowsAfter(organizationId, afterId)} order by organization_id, id limit ${SEARCH_WALK})
    select found.*, edge.walked, edge.last_id from (select count(*) as walked, max(id) as last_id from walk) edge
    left join lateral (
      select * from walk where name ilike ${pattern} or email ilike ${pattern} or company ilike ${pattern} order by id limit ${limit}
    ) found on true`.execute(db);
  const { walked, last_id: lastId } = rows[0]!;
  const found: Contact[] = rows.filter((row) => row.id !== null).map(({ walked: _w, last_id: _l, ...contact }) => contact);
  if (found.length === limit || walked < SEARCH_WALK || lastId === null) return found;
  // 2. The probe, under bitmap scans only (the function's SET clauses, migration 0009).
  const need = limit - found.length;
  const { rows: probed } = await sql<{ ids: (number | string)[] }>`select contacts_search_probe(${organizationId}, ${lastId}, ${pattern}) as ids`.execute(db);
  const ids = probed[0]!.ids.map(Number).sort((a, b) => a - b);
  if (ids.length === 0) return found;
  const inOrganization = (qb: DB) => qb.selectFrom('contacts').selectAll().where('organization_id', '=', organizationId);
  if (ids.length < SEARCH_PROBE) return [...found, ...(await inOrganization(db).where('id', 'in', ids.slice(0, need)).orderBy('id').execute())];
  // 3. The id range up to the need-th of them, planned with its bounds known, under bitmap scans
  // only: the trigram index, or the range of the organization's index, whichever the range makes cheaper.
  const rest = await db.transaction().execute(async (trx) => {
    await sql`select set_config('enable_seqscan', 'off', true), set_config('enable_indexscan', 'off', true)`.execute(trx);
    return inOrganization(trx)
      .where('id', '>', lastId)
      .where('id', '<=', ids[need - 1]!)
      .where(sql<boolean>`(name ilike ${pattern} or email ilike ${pattern} or company ilike ${pattern})`)
      .orderBy('id')
      .limit(need)
      .execute();
  });
  return [...found, ...rest];
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
        querystring: z.object({ ...listQuery, q: text(200)
            .refine(searchable, 'too short to search: use at least 3 letters or digits in a row')
            .optional()
            .describe('a case-insensitive substring of the name, email or company; at least 3 letters or digits in a row (or two words, as in "Li Na"); served by a trigram index') }),
        response: { 200: listOf(contactSchema), ...errorResponses },
      },
    },
    async (req) => {
      const { organizationId } = authOf(req);
      const afterId = decodeCursor(req.query.cursor);
      return listPage(req.query.limit, (limit) => listContacts(db, organizationId, { afterId, limit, q: req.query.q }), (c) => c.id, contactOut);
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

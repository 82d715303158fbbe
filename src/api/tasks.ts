/** Tasks: the repository (every function takes the organization id first) and the routes. */
import { sql } from 'kysely';
import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { recordAuditEvent } from '../audit/events.js';
import type { DB } from '../db/connect.js';
import { isForeignKeyViolation } from '../db/errors.js';
import type { Task } from '../db/schema.js';
import { InvalidRequestError, NotFoundError } from '../errors.js';
import { actorOf, authOf, pathId } from './auth.js';
import { text } from './contacts.js';
import { decodeCursor, listPage, listQuery } from './pagination.js';
import { errorResponses, idParams, listOf, orgParams } from './schemas.js';

export const taskSchema = z
  .object({
    id: z.number().int(),
    title: z.string(),
    description: z.string().nullable(),
    status: z.enum(['open', 'done']),
    due_on: z.iso.date().nullable(),
    contact_id: z.number().int().nullable(),
    completed_at: z.iso.datetime().nullable(),
    created_at: z.iso.datetime(),
    updated_at: z.iso.datetime(),
  })
  .meta({ id: 'Task' });

/** An ISO date PostgreSQL accepts (it has no year 0). */
const dueOn = z.iso.date().refine((d) => !d.startsWith('0000'), 'must be a date from year 0001 on');

const taskFields = {
  title: text(200).min(1, 'must not be empty'),
  description: text(10_000).nullable().optional(),
  status: z.enum(['open', 'done']).optional(),
  due_on: dueOn.nullable().optional(),
  contact_id: z.number().int().positive().max(Number.MAX_SAFE_INTEGER).nullable().optional(),
};
const newTaskSchema = z.strictObject(taskFields);
const taskPatchSchema = z
  .strictObject({ ...taskFields, title: taskFields.title.optional() })
  .refine((v) => Object.keys(v).length > 0, 'send at least one field');

export function taskOut(t: Task): z.infer<typeof taskSchema> {
  return {
    id: t.id,
    title: t.title,
    description: t.description,
    status: t.status,
    due_on: t.due_on,
    contact_id: t.contact_id,
    completed_at: t.completed_at?.toISOString() ?? null,
    created_at: t.created_at.toISOString(),
    updated_at: t.updated_at.toISOString(),
  };
}

/** The composite foreign key (organization_id, contact_id) refuses another organization's contact. */
function unknownContact(err: unknown): never {
  if (isForeignKeyViolation(err)) {
    throw new InvalidRequestError('contact_id does not name a contact of this organization', {
      details: [{ path: 'contact_id', message: 'no such contact in this organization' }],
    });
  }
  throw err;
}

/** status and completed_at move together: done sets completed_at (once), open clears it. */
function statusChange(status: 'open' | 'done' | undefined) {
  if (status === 'done') return { status, completed_at: sql<Date>`coalesce(completed_at, now())` };
  if (status === 'open') return { status, completed_at: null };
  return {};
}

/**
 * Up to `limit` tasks after `afterId` in id order, filtered by status and contact if given. Each
 * filter has an index that ends with id ((organization_id, status, id), (organization_id,
 * contact_id, id)), so a page is read in order however many tasks the organization has.
 */
export async function listTasks(
  db: DB,
  organizationId: number,
  options: { afterId: number; limit: number; status?: Task['status'] | undefined; contactId?: number | undefined },
): Promise<Task[]> {
  let query = db.selectFrom('tasks').selectAll().where('organization_id', '=', organizationId).where('id', '>', options.afterId);
  if (options.status) query = query.where('status', '=', options.status);
  if (options.contactId) query = query.where('contact_id', '=', options.contactId);
  return query.orderBy('id').limit(options.limit).execute();
}

export const taskRoutes: FastifyPluginAsyncZod<{ db: DB }> = async (app, { db }) => {
  app.get(
    '/tasks',
    {
      config: { scope: 'tasks.read' },
      schema: {
        tags: ['tasks'],
        summary: 'List tasks',
        params: orgParams,
        querystring: z.object({
          ...listQuery,
          status: z.enum(['open', 'done']).optional(),
          contact_id: z.coerce.number().int().positive().max(Number.MAX_SAFE_INTEGER).optional(),
        }),
        response: { 200: listOf(taskSchema), ...errorResponses },
      },
    },
    async (req) => {
      const { organizationId } = authOf(req);
      const filter = { afterId: decodeCursor(req.query.cursor), status: req.query.status, contactId: req.query.contact_id };
      return listPage(req.query.limit, (limit) => listTasks(db, organizationId, { ...filter, limit }), (t) => t.id, taskOut);
    },
  );

  app.post(
    '/tasks',
    {
      config: { scope: 'tasks.write' },
      schema: { tags: ['tasks'], summary: 'Create a task', params: orgParams, body: newTaskSchema, response: { 201: taskSchema, ...errorResponses } },
    },
    async (req, reply) => {
      const { organizationId } = authOf(req);
      const b = req.body;
      const task = await db
        .insertInto('tasks')
        .values({
          organization_id: organizationId,
          title: b.title,
          description: b.description ?? null,
          due_on: b.due_on ?? null,
          contact_id: b.contact_id ?? null,
          status: b.status ?? 'open',
          completed_at: b.status === 'done' ? sql<Date>`now()` : null,
        })
        .returningAll()
        .executeTakeFirstOrThrow()
        .catch(unknownContact);
      reply.code(201).header('location', `/api/v1/${organizationId}/tasks/${task.id}`);
      return taskOut(task);
    },
  );

  app.get(
    '/tasks/:id',
    {
      config: { scope: 'tasks.read' },
      schema: { tags: ['tasks'], summary: 'Get a task', params: idParams, response: { 200: taskSchema, ...errorResponses } },
    },
    async (req) => {
      const task = await db
        .selectFrom('tasks')
        .selectAll()
        .where('organization_id', '=', authOf(req).organizationId)
        .where('id', '=', pathId(req.params.id))
        .executeTakeFirst();
      if (!task) throw new NotFoundError('no such task');
      return taskOut(task);
    },
  );

  app.patch(
    '/tasks/:id',
    {
      config: { scope: 'tasks.write' },
      schema: { tags: ['tasks'], summary: 'Change a task', params: idParams, body: taskPatchSchema, response: { 200: taskSchema, ...errorResponses } },
    },
    async (req) => {
      const { status, ...rest } = req.body;
      const task = await db
        .updateTable('tasks')
        .set({ ...rest, ...statusChange(status), updated_at: sql`now()` })
        .where('organization_id', '=', authOf(req).organizationId)
        .where('id', '=', pathId(req.params.id))
        .returningAll()
        .executeTakeFirst()
        .catch(unknownContact);
      if (!task) throw new NotFoundError('no such task');
      return taskOut(task);
    },
  );

  app.delete(
    '/tasks/:id',
    {
      config: { scope: 'tasks.write' },
      schema: { tags: ['tasks'], summary: 'Delete a task', params: idParams, response: { 204: z.null().describe('deleted'), ...errorResponses } },
    },
    async (req, reply) => {
      const auth = authOf(req);
      const deleted = await db
        .deleteFrom('tasks')
        .where('organization_id', '=', auth.organizationId)
        .where('id', '=', pathId(req.params.id))
        .returning(['id', 'title'])
        .executeTakeFirst();
      if (!deleted) throw new NotFoundError('no such task');
      await recordAuditEvent(db, {
        organizationId: auth.organizationId,
        action: 'task.deleted',
        actor: actorOf(auth),
        details: { task_id: deleted.id, title: deleted.title },
      });
      return reply.code(204).send(null);
    },
  );
};

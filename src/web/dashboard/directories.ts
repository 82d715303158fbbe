/**
 * The Directory sync page (/dashboard/directories): the organization's SCIM directories
 * (src/directory/directories.ts) and, for each (/dashboard/directories/<id>), its base URL, state,
 * default role and group mappings, the users and groups it pushed, and its last requests with
 * their outcome. directory.read shows it all; directory.write adds the forms: create, rename and
 * change the default role, enable or disable, map a group to a role or remove the mapping, rotate
 * the token, delete. The roles offered (and accepted: the domain checks them with the member's
 * role) are those the member could give by hand, never owner. Ids from URLs are always looked up
 * within the current organization (another organization's is a 404), and every change is audited
 * with the acting member.
 *
 * A new or rotated token is shown in the answer to the POST itself (201/200, no-store, never a
 * redirect): it exists in plaintext nowhere else. Other changes answer 303 back to the page,
 * which then says what they did (notice.ts); a refusal is shown on the page at its status.
 *
 * The users are keyset-paged on seq (`?after=<seq>`) and searched by userName prefix (`?q=`) on
 * the (directory_id, lower(user_name)) index; groups are paged on seq (`?groups_after=`); counts
 * stop at 1,000 (src/directory/views.ts): the page costs the same for 100 users and 100,000.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { builtinRole, mayAssign } from '../../accounts/roles.js';
import type { DirectoryRole } from '../../db/schema.js';
import { scimBaseUrl } from '../../directory/base-url.js';
import {
  createDirectory,
  deleteDirectory,
  DIRECTORY_ROLES,
  type DirectoryView,
  getDirectory,
  listDirectories,
  MAX_DIRECTORIES,
  rotateDirectoryToken,
  updateDirectory,
} from '../../directory/directories.js';
import { recentDirectoryRequests } from '../../directory/request-log.js';
import { boundedCount, directoryUserCounts, listDirectoryGroups, listDirectoryUsers, mappedRole, MAX_PREFIX } from '../../directory/views.js';
import { InvalidRequestError, NotFoundError } from '../../errors.js';
import type { Params } from '../../oauth/helpers/params.js';
import { renderPage } from '../render.js';
import type { DashboardDeps } from './applications.js';
import { type ActionContext, DASHBOARD_PAGE_SIZE, dashboardContext, type DashboardContext, parseId, readForm, requireAction, requireView } from './context.js';
import { redirectWithNotice } from './notice.js';
import { showingRefusals } from './sso.js';

export const DIRECTORIES_PATH = '/dashboard/directories';
/** The requests a directory's page shows, newest first (the log keeps more: request-log.ts). */
const RECENT_REQUESTS = 100;

/** The directories partial's list (directories-table.eta): each with its SCIM base URL and its path under `base`. */
export function directoriesForPage<D extends DirectoryView>(directories: D[], options: { issuer: string; base: string }) {
  return directories.map((d) => ({ ...d, base_url: scimBaseUrl(options.issuer, d.id), path: `${options.base}/${d.id}` }));
}

/** What the token partial (directory-token.eta) shows of a token just made or rotated. */
export function tokenForPage(made: { directory: DirectoryView; token: string }, rotated: boolean, issuer: string) {
  return { ...made, rotated, base_url: scimBaseUrl(issuer, made.directory.id) };
}

/** The roles a directory may give that the member could give by hand (never owner): what the forms offer. */
function assignableRoles(ctx: DashboardContext): DirectoryRole[] {
  const access = ctx.organization?.access;
  return access ? DIRECTORY_ROLES.filter((r) => mayAssign(access, builtinRole(r))) : [];
}

/** A role the form offers, with the current one kept (to be seen, not given) when the member could not give it. */
const roleChoices = (roles: DirectoryRole[], current: DirectoryRole) => (roles.includes(current) ? roles : [current, ...roles]);

interface UsersQuery {
  /** A userName prefix; '' for all. */
  q: string;
  after: number | undefined;
  groupsAfter: number | undefined;
}

interface ListView {
  errors?: string[];
  form?: { name: string; defaultRole: string };
  token?: ReturnType<typeof tokenForPage>;
}

interface DirectoryPageView {
  errors?: string[];
  token?: ReturnType<typeof tokenForPage>;
  settings?: { name: string; defaultRole: string };
  mapping?: { group: string; role: string };
  query?: UsersQuery;
}

function usersQuery(query: Record<string, unknown>): UsersQuery {
  const q = typeof query.q === 'string' ? query.q.trim().slice(0, MAX_PREFIX) : '';
  return { q, after: parseId(query.after), groupsAfter: parseId(query.groups_after) };
}

/** `path` with the query's fields that are set, and `anchor`. */
function pageUrl(path: string, fields: Record<string, string | number | undefined>, anchor: string): string {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(fields)) if (value !== undefined && value !== '') query.set(name, String(value));
  const text = query.toString();
  return `${path}${text === '' ? '' : `?${text}`}#${anchor}`;
}

export async function directoryRoutes(app: FastifyInstance, deps: DashboardDeps): Promise<void> {
  const { db, config } = deps;

  async function renderList(reply: FastifyReply, ctx: DashboardContext, status: number, view: ListView = {}) {
    requireView(ctx, 'directory.read');
    const organization = ctx.organization;
    const directories = organization ? await listDirectories(db, organization.id) : [];
    const users = await directoryUserCounts(db, directories.map((d) => d.id));
    const roles = ctx.can['directory.write'] ? assignableRoles(ctx) : [];
    return renderPage(reply, status, 'dashboard/directories', {
      title: 'Directory sync',
      ctx,
      active: 'directories',
      manage: ctx.can['directory.write'],
      // The partials' settings: names link to each directory's page, with its roles and users; no token button in the list.
      detailed: true,
      rotate: false,
      directories: directoriesForPage(directories.map((d) => ({ ...d, users: boundedCount(users.get(d.id) ?? 0) })), { issuer: config.issuer, base: DIRECTORIES_PATH }),
      full: directories.length >= MAX_DIRECTORIES,
      maxDirectories: MAX_DIRECTORIES,
      roles,
      createAction: DIRECTORIES_PATH,
      createForm: view.form ?? { name: '', defaultRole: roles.includes('member') ? 'member' : (roles[0] ?? '') },
      token: view.token,
      errors: view.errors ?? [],
    });
  }

  async function renderDirectory(reply: FastifyReply, ctx: DashboardContext, status: number, id: number | undefined, view: DirectoryPageView = {}) {
    requireView(ctx, 'directory.read');
    const organization = ctx.organization;
    if (!organization || id === undefined) throw new NotFoundError('There is no such directory in this organization.');
    const directory = await getDirectory(db, organization.id, id);
    const query = view.query ?? { q: '', after: undefined, groupsAfter: undefined };
    const path = `${DIRECTORIES_PATH}/${directory.id}`;
    const [users, groups, requests, counts] = await Promise.all([
      listDirectoryUsers(db, organization.id, directory.id, { after: query.after ?? 0, limit: DASHBOARD_PAGE_SIZE + 1, prefix: query.q }),
      listDirectoryGroups(db, directory.id, { after: query.groupsAfter ?? 0, limit: DASHBOARD_PAGE_SIZE + 1 }),
      recentDirectoryRequests(db, directory.id, RECENT_REQUESTS),
      directoryUserCounts(db, [directory.id]),
    ]);
    const manage = ctx.can['directory.write'];
    const roles = manage ? assignableRoles(ctx) : [];
    const lastUser = users[DASHBOARD_PAGE_SIZE - 1];
    const lastGroup = groups[DASHBOARD_PAGE_SIZE - 1];
    const { q, after, groupsAfter } = query;
    return renderPage(reply, status, 'dashboard/directory', {
      title: directory.name,
      ctx,
      active: 'directories',
      manage,
      directory,
      path,
      baseUrl: scimBaseUrl(config.issuer, directory.id),
      usersCount: boundedCount(counts.get(directory.id) ?? 0),
      roles,
      defaultRoles: roleChoices(roles, directory.default_role),
      settings: view.settings ?? { name: directory.name, defaultRole: directory.default_role },
      mappingForm: view.mapping ?? { group: '', role: roles.includes('member') ? 'member' : (roles[0] ?? '') },
      mappings: directory.group_roles,
      // Changing the mappings replaces them whole: for those who could give every role they hold (the domain refuses it otherwise).
      mappingsEditable: manage && roles.length > 0 && directory.group_roles.every((m) => roles.includes(m.role)),
      q,
      users: users.slice(0, DASHBOARD_PAGE_SIZE),
      usersPager: {
        first: after === undefined ? '' : pageUrl(path, { q, groups_after: groupsAfter }, 'users'),
        next: users.length > DASHBOARD_PAGE_SIZE && lastUser ? pageUrl(path, { q, after: lastUser.seq, groups_after: groupsAfter }, 'users') : '',
        of: 'users',
      },
      clearSearch: q === '' ? '' : pageUrl(path, { groups_after: groupsAfter }, 'users'),
      groups: groups.slice(0, DASHBOARD_PAGE_SIZE).map((g) => ({ ...g, membersShown: boundedCount(g.members), role: mappedRole(g, directory.group_roles) })),
      groupsPager: {
        first: groupsAfter === undefined ? '' : pageUrl(path, { q, after }, 'groups'),
        next: groups.length > DASHBOARD_PAGE_SIZE && lastGroup ? pageUrl(path, { q, after, groups_after: lastGroup.seq }, 'groups') : '',
        of: 'groups',
      },
      requests,
      recentRequests: RECENT_REQUESTS,
      token: view.token,
      errors: view.errors ?? [],
    });
  }

  const actor = (ctx: ActionContext) => ({ actorUserId: ctx.session.userId });

  /** Back to the directory's page (or the list), at `anchor`, saying `notice`. */
  function done(reply: FastifyReply, ctx: ActionContext, notice: string, directoryId?: number, anchor = '') {
    const location = directoryId === undefined ? DIRECTORIES_PATH : `${DIRECTORIES_PATH}/${directoryId}${anchor === '' ? '' : `#${anchor}`}`;
    return redirectWithNotice(reply, config, ctx.session.sessionId, location, notice);
  }

  app.get(DIRECTORIES_PATH, async (req, reply) => renderList(reply, dashboardContext(req), 200));

  app.post(DIRECTORIES_PATH, async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: 'directory.write' });
    const form = { name: params.name ?? '', defaultRole: params.default_role ?? '' };
    return showingRefusals(
      async () => {
        const input = { name: form.name, ...(params.default_role === undefined ? {} : { default_role: params.default_role }) };
        const made = await createDirectory(db, ctx.organization.id, input, actor(ctx), ctx.organization.access);
        // The token exists in plaintext only in this answer (no-store, never a redirect).
        return renderList(reply, ctx, 201, { token: tokenForPage(made, false, config.issuer) });
      },
      (status, errors) => renderList(reply, ctx, status, { errors, form }),
    );
  });

  app.get<{ Params: { id: string }; Querystring: Record<string, unknown> }>(`${DIRECTORIES_PATH}/:id`, async (req, reply) =>
    renderDirectory(reply, dashboardContext(req), 200, parseId(req.params.id), { query: usersQuery(req.query) }),
  );

  /** The directory named in the URL, for someone who manages directories; another organization's is a 404. */
  async function managedDirectory(req: FastifyRequest<{ Params: { id: string } }>): Promise<{ ctx: ActionContext; params: Params; directory: DirectoryView }> {
    const { params } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: 'directory.write' });
    const id = parseId(req.params.id);
    if (id === undefined) throw new NotFoundError('There is no such directory in this organization.');
    return { ctx, params, directory: await getDirectory(db, ctx.organization.id, id) };
  }

  /** Changes the directory; a refusal is shown on its page (with `view`: what was typed), at its status. */
  function change(reply: FastifyReply, ctx: ActionContext, directory: DirectoryView, input: Record<string, unknown>, view: DirectoryPageView, notice: (saved: DirectoryView) => string, anchor: string) {
    return showingRefusals(
      async () => {
        const saved = await updateDirectory(db, ctx.organization.id, directory.id, input, actor(ctx), ctx.organization.access);
        return done(reply, ctx, notice(saved), directory.id, anchor);
      },
      (status, errors) => renderDirectory(reply, ctx, status, directory.id, { ...view, errors }),
    );
  }

  // Name and default role.
  app.post<{ Params: { id: string } }>(`${DIRECTORIES_PATH}/:id`, async (req, reply) => {
    const { ctx, params, directory } = await managedDirectory(req);
    const settings = { name: params.name ?? '', defaultRole: params.default_role ?? directory.default_role };
    // The default role only when changed: changing it is for those who could give both the old and the new one.
    const input = { name: settings.name, ...(settings.defaultRole === directory.default_role ? {} : { default_role: settings.defaultRole }) };
    const followed = settings.defaultRole === directory.default_role ? '' : ' The members it provisioned get their new roles in a moment.';
    return change(reply, ctx, directory, input, { settings }, (saved) => `Directory ${saved.name} saved.${followed}`, 'settings');
  });

  app.post<{ Params: { id: string } }>(`${DIRECTORIES_PATH}/:id/state`, async (req, reply) => {
    const { ctx, params, directory } = await managedDirectory(req);
    const state = params.state;
    if (state !== 'active' && state !== 'disabled') throw new InvalidRequestError('Choose active or disabled.');
    const notice = (saved: DirectoryView) =>
      state === 'active' ? `Directory ${saved.name} is active: its SCIM requests are accepted again.` : `Directory ${saved.name} is disabled: its SCIM requests are refused until you enable it.`;
    return change(reply, ctx, directory, { state }, {}, notice, 'settings');
  });

  // Group mappings: the whole list is replaced with one more (or one changed), or one fewer.
  app.post<{ Params: { id: string } }>(`${DIRECTORIES_PATH}/:id/mappings`, async (req, reply) => {
    const { ctx, params, directory } = await managedDirectory(req);
    const mapping = { group: (params.group ?? '').trim(), role: params.role ?? '' };
    // The one mapping's problems under its own fields (the domain would name its place in the list).
    const problems = [
      ...(mapping.group === '' ? ['Group: must not be empty'] : []),
      ...((DIRECTORY_ROLES as readonly string[]).includes(mapping.role) ? [] : [`Role: must be one of ${DIRECTORY_ROLES.join(', ')} (a directory never makes owners)`]),
    ];
    if (problems.length > 0) return renderDirectory(reply, ctx, 400, directory.id, { mapping, errors: problems });
    const others = directory.group_roles.filter((m) => m.group.toLowerCase() !== mapping.group.toLowerCase());
    const input = { group_roles: [...others, mapping] };
    return change(reply, ctx, directory, input, { mapping }, (saved) => `Members of the group ${mapping.group} get the role ${mapping.role} from ${saved.name}.`, 'mappings');
  });

  app.post<{ Params: { id: string } }>(`${DIRECTORIES_PATH}/:id/mappings/remove`, async (req, reply) => {
    const { ctx, params, directory } = await managedDirectory(req);
    const group = params.group ?? '';
    const kept = directory.group_roles.filter((m) => m.group.toLowerCase() !== group.toLowerCase());
    if (kept.length === directory.group_roles.length) throw new NotFoundError(`The group ${group} is not mapped.`);
    return change(reply, ctx, directory, { group_roles: kept }, {}, (saved) => `The group ${group} no longer gives a role in ${saved.name}.`, 'mappings');
  });

  app.post<{ Params: { id: string } }>(`${DIRECTORIES_PATH}/:id/rotate-token`, async (req, reply) => {
    const { ctx, directory } = await managedDirectory(req);
    const rotated = await rotateDirectoryToken(db, ctx.organization.id, directory.id, actor(ctx));
    return renderDirectory(reply, ctx, 200, directory.id, { token: tokenForPage(rotated, true, config.issuer) });
  });

  app.post<{ Params: { id: string } }>(`${DIRECTORIES_PATH}/:id/delete`, async (req, reply) => {
    const { ctx, params, directory } = await managedDirectory(req);
    if (params.confirm !== 'delete') {
      requireView(ctx, 'directory.read');
      return renderPage(reply, 200, 'dashboard/directory-delete', { title: `Delete ${directory.name}`, ctx, active: 'directories', directory, path: `${DIRECTORIES_PATH}/${directory.id}` });
    }
    await deleteDirectory(db, ctx.organization.id, directory.id, actor(ctx));
    return done(reply, ctx, `Deleted the directory ${directory.name}: its token no longer works. The people it provisioned stay members.`);
  });
}

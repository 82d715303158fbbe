/**
 * Directories on pages: the shapes the directory partials (views/dashboard/directory-token.eta,
 * directories-table.eta, directory-create.eta) read, for a setup link's directory page and the
 * dashboard's Directory sync page alike.
 */
import { scimBaseUrl } from '../../directory/base-url.js';
import type { DirectoryView } from '../../directory/directories.js';

/** The directories partial's list (directories-table.eta): each with its SCIM base URL and its path under `base`. */
export function directoriesForPage<D extends DirectoryView>(directories: D[], options: { issuer: string; base: string }) {
  return directories.map((d) => ({ ...d, base_url: scimBaseUrl(options.issuer, d.id), path: `${options.base}/${d.id}` }));
}

/** What the token partial (directory-token.eta) shows of a token just made or rotated. */
export function tokenForPage(made: { directory: DirectoryView; token: string }, rotated: boolean, issuer: string) {
  return { ...made, rotated, base_url: scimBaseUrl(issuer, made.directory.id) };
}

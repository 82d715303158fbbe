/** Every kind of job, with what its steps tell once committed (this instance's revoked set). */
import { memberGrantsJob } from '../accounts/organizations.js';
import { roleDeletionJob, roleGrantsJob } from '../accounts/roles.js';
import { applicationGrantsJob } from '../oauth/models/applications.js';
import type { RevokedGrantsMemory } from '../oauth/models/grants.js';
import type { JobHandler } from './queue.js';
import { directoryRolesJob } from '../directory/provisioning.js';

export function jobHandlers(memory?: RevokedGrantsMemory): JobHandler<any, any>[] {
  return [applicationGrantsJob(memory), roleGrantsJob(memory), roleDeletionJob(memory), memberGrantsJob(memory), directoryRolesJob(memory)];
}

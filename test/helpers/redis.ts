/** Whether the machine's Redis answers on 127.0.0.1:6379 (tests of shared rate limits need it). */
import { Socket } from 'node:net';

export const REDIS_URL = 'redis://127.0.0.1:6379/0';

export async function redisAnswers(): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = new Socket();
    socket.setTimeout(300);
    socket.once('connect', () => (socket.destroy(), resolve(true)));
    socket.once('error', () => resolve(false));
    socket.once('timeout', () => (socket.destroy(), resolve(false)));
    socket.connect(6379, '127.0.0.1');
  });
}

import type { RecordStore } from '../../actors/gateway/store/types.js';
import type { OutcomeReport } from './task2batch.js';

/**
 * The trainer-controller's `readReports` port over the record store: a scenario's outcome reports
 * (`POST /reef/report`), oldest first, from a cursor the store gave. A page that is not full has
 * no `next`, so the controller reads it again from the same cursor, skipping the reports it applied.
 */
export function reportReader(store: Pick<RecordStore, 'listReports'>) {
  return async (scenario: string, after: string | null, limit: number): Promise<{ items: OutcomeReport[]; next: string | null }> => {
    const page = await store.listReports({ scenario, after, limit, order: 'asc' });
    return { items: page.items.map((r) => ({ id: r.id, score: r.score, references: r.references, createdAt: r.createdAt })), next: page.next };
  };
}

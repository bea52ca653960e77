import { describe, expect, it } from 'vitest';
import { parsePrometheusText } from '../../test/helpers/prometheus-text.js';
import { GatewayMetrics, labelKey } from './metrics.js';

describe('metrics', () => {
  it('writes label sets with sorted names and Prometheus escapes', () => {
    expect(labelKey({})).toBe('');
    expect(labelKey({ route: '/v1/models' })).toBe('route="/v1/models"');
    expect(labelKey({ status: '200', route: '/a' })).toBe('route="/a",status="200"');
    expect(labelKey({ s: 'a\\b"c\nd' })).toBe('s="a\\\\b\\"c\\nd"');
  });

  it('counts and buckets by label set, whatever the order the labels were given in', () => {
    const m = new GatewayMetrics();
    m.records.inc({ scenario: 'x', status: 'ok' });
    m.records.inc({ status: 'ok', scenario: 'x' }, 2);
    expect(m.records.get({ scenario: 'x', status: 'ok' })).toBe(3);
    m.commitLatency.observe(0.003);
    m.commitLatency.observe(20);
    const text = m.render();
    expect(text).toContain('reef_records_total{scenario="x",status="ok"} 3');
    expect(text).toContain('reef_record_commit_seconds_bucket{le="0.002"} 0');
    expect(text).toContain('reef_record_commit_seconds_bucket{le="0.005"} 1');
    expect(text).toContain('reef_record_commit_seconds_bucket{le="+Inf"} 2');
    expect(text).toContain('reef_record_commit_seconds_count 2');
  });

  it('leaves out the series of scenarios a scrape may not see', () => {
    const m = new GatewayMetrics();
    m.records.inc({ scenario: 'alpha', status: 'ok' });
    m.records.inc({ scenario: 'secret-beta', status: 'ok' });
    m.tokens.inc({ kind: 'prompt' }, 5);
    m.latency.observe(0.01, { route: '/x', scenario: 'secret-beta' });
    const limited = m.render((s) => s === 'alpha');
    expect(limited).toContain('reef_records_total{scenario="alpha",status="ok"} 1');
    expect(limited).toContain('reef_tokens_total{kind="prompt"} 5');
    expect(limited).not.toContain('secret-beta');
    expect(m.render()).toContain('reef_records_total{scenario="secret-beta",status="ok"} 1');
    expect(m.render()).toContain('reef_http_request_duration_seconds_bucket{route="/x",scenario="secret-beta",le="0.01"} 1');
  });

  it('renders an exposition a strict reader takes, whole and filtered, with every family\'s samples', () => {
    const m = new GatewayMetrics();
    const odd = 'a\\b"c\nd';
    m.requests.inc({ route: odd, code: '200' });
    m.latency.observe(0.003, { route: odd });
    m.latency.observe(100, { route: odd });
    m.tokens.inc({ kind: 'prompt' }, 7);
    m.records.inc({ scenario: 'alpha', status: 'ok' });
    m.records.inc({ scenario: 'beta', status: 'aborted' });
    m.commitLatency.observe(0.01);
    m.engineErrors.inc({ kind: 'generate' });
    m.addSection(() => '# HELP reef_extra An extra section\n# TYPE reef_extra gauge\nreef_extra 1');
    const all = parsePrometheusText(m.render());
    const value = (name: string, labels: Record<string, string> = {}) => all.find((x) => x.name === name && JSON.stringify(x.labels) === JSON.stringify(labels))?.value;
    expect(value('reef_http_requests_total', { code: '200', route: odd })).toBe(1);
    expect(value('reef_http_request_duration_seconds_bucket', { route: odd, le: '+Inf' })).toBe(2);
    expect(value('reef_http_request_duration_seconds_bucket', { route: odd, le: '60' })).toBe(1);
    expect(value('reef_http_request_duration_seconds_sum', { route: odd })).toBe(100.003);
    expect(value('reef_record_commit_seconds_count')).toBe(1);
    expect(value('reef_engine_errors_total', { kind: 'generate' })).toBe(1);
    expect(value('reef_inflight_requests')).toBe(0);
    expect(value('reef_extra')).toBe(1);
    const limited = parsePrometheusText(m.render((s) => s === 'alpha'));
    expect(limited.filter((x) => x.labels.scenario !== undefined).map((x) => x.labels.scenario)).toEqual(['alpha']);
  });
});

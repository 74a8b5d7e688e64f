"""The runner's persistent batch: per-request rows kept between steps, and a step's input tensors.

vLLM v1's persistent batch: a request that only decodes arrives as its id (scheduler_output.py), so
its row here holds everything its step needs:

    row r:  num_computed[r]   tokens with K/V in the cache (the position of the next token)
            last_token[r]     the token the runner sampled for it last step (its next input), once on the host
            num_output[r]     tokens generated so far (seeded sampling derives its generator from it)
            prev_sample[r]    1 + its index in the previous step's sampled ids on the device (0: none)
            params[r]         its SamplingParams;  block table row r in ``block_tables``

A full ``ScheduledRequest`` (new, resumed, prefill chunk) (re)sets its row. The step's rows are
ordered decodes-first, longest context first (see attention/metadata.py), and all index arithmetic
is done on whole arrays:
    positions[t]    = num_computed[req(t)] + (t - query_start_loc[req(t)])
    slot_mapping[t] = block_table[req(t), positions[t] // block_size] * block_size + positions[t] % block_size
    logits_indices  = query_start_loc[1:] - 1 for the requests that sample (their last token)

Async scheduling launches a step before the host has the previous step's samples: a decode row sampled
by the previous step takes its input id from that step's sampled tensor, on the device (``prev_sample``).

The arrays are packed into one host buffer allocated once and copied to its device twin in one
non-blocking upload per step (``step_upload``, a ``PackedUpload`` of cpu_gpu_buffer.py); on a CPU device the two are the
same memory.
"""

from __future__ import annotations

from operator import attrgetter

import numpy as np
import torch
from kvmesh.replica.attention.metadata import CommonAttentionMetadata
from kvmesh.replica.sample.draws import RandomDraws
from kvmesh.replica.sample.fixed_sampler import fixed_settings
from kvmesh.replica.sample.penalties import PenaltyState
from kvmesh.replica.sample.sampler import SamplingMetadata, build_sampling_metadata
from kvmesh.replica.sample.token_lists import BatchTokenLists
from kvmesh.replica.step.scheduler_output import ScheduledRequest, SchedulerOutput
from kvmesh.replica.utils.cpu_gpu_buffer import PackedUpload
from kvmesh.replica.worker.batch_loras import BatchLoRAs
from kvmesh.replica.worker.block_table import BlockTables
from kvmesh.replica.worker.graphs.dispatcher import BatchDescriptor, CudagraphDispatcher, StepPath
from kvmesh.replica.worker.model_inputs import ModelInputs, step_upload
from kvmesh.replica.worker.step_arrays import StepArrays, StepTensors, step_arrays, token_ids_of

__all__ = ["BlockTables", "InputBatch", "ModelInputs", "prepare_inputs"]

_sample = attrgetter("sample")
_ALL_GREEDY = SamplingMetadata(None, None, None, None, None)


class InputBatch:
    def __init__(self, max_num_reqs: int, max_blocks_per_req: int, block_size: int, device: torch.device,
                 max_num_tokens: int | None = None, seed: int = 0) -> None:
        self.block_size, self.device = block_size, device
        self.draws = RandomDraws(seed)  # keys of unseeded random rows, for the eager and the graph's sampler
        self.block_tables = BlockTables(max_num_reqs, max_blocks_per_req)
        self.buffers = step_upload(max_num_tokens or max_num_reqs, max_num_reqs, max_blocks_per_req, device)
        self.sampling_upload = PackedUpload(64 * max_num_reqs, device)  # non-greedy rows' settings (grows)
        self.num_computed = np.zeros(0, np.int64)
        self.last_token = np.zeros(0, np.int64)
        self.num_output = np.zeros(0, np.int64)
        self.prev_sample = np.zeros(0, np.int64)
        self.prev_sampled: torch.Tensor | None = None  # [N] the previous step's sampled ids, on the device
        self.dispatcher = CudagraphDispatcher()  # each step's path; the runner hands it its graphs (graphs/)
        self._prev_rows = np.zeros(0, np.int64)
        self.plain_greedy = np.zeros(0, bool)  # greedy, no min_tokens/logit_bias/logprobs: no sampling metadata
        self.penalized = np.zeros(0, bool)  # rows whose output counts and prompt mask ``penalties`` keeps
        self.penalties = PenaltyState(device)
        self.token_lists = BatchTokenLists(device)  # rows' logit_bias / allowed / min_tokens bans, kept across steps
        self.req_ids = np.zeros(0, object)
        self.params: list = []
        self.loras = BatchLoRAs()  # each row's adapter (batch_loras.py); the runner hands it its LoRAManager
        self._fit_rows()

    def _fit_rows(self) -> None:
        n, old = self.block_tables.num_rows, len(self.params)
        if n > old:
            for name in ("num_computed", "last_token", "num_output", "prev_sample", "plain_greedy", "penalized",
                         "req_ids"):
                a = getattr(self, name)
                setattr(self, name, np.concatenate([a, np.zeros(n - old, a.dtype)]))
            self.params += [None] * (n - old)
            self.token_lists.fit(n)
            self.loras.fit(n)

    def free(self, request_ids) -> None:
        rows = self.block_tables.rows
        freed = [rows[rid] for rid in request_ids if rid in rows]
        self.prev_sample[freed] = 0
        for row in freed:
            self.token_lists.clear_row(row)
        self.block_tables.free(request_ids)

    def _admit(self, srs: list[ScheduledRequest]) -> np.ndarray:
        """(Re)set the rows of fully sent requests; returns their rows."""
        rows = [self.block_tables.sync(sr.request_id, sr.block_ids) for sr in srs]
        self._fit_rows()
        for sr, row in zip(srs, rows, strict=True):
            sp = sr.sampling_params
            self.req_ids[row], self.params[row], self.num_output[row] = sr.request_id, sp, len(sr.output_token_ids)
            self.plain_greedy[row] = (sp.greedy and not sp.min_tokens and not sp.logit_bias
                                      and not sp.allowed_token_ids and sp.logprobs is None and not sp.penalized
                                      and sp.structured_outputs is None)
            self.penalized[row] = sp.penalized
            self.token_lists.set_row(row, sp)
            if sp.penalized:  # counted from the request's tokens: new, resumed, or a later chunk alike
                self.penalties.reset(row, sr.prompt_token_ids or [], sr.output_token_ids)
            self.num_computed[row] = sr.num_computed_tokens
            self.prev_sample[row] = 0  # its input ids come with it
            self.loras.set_row(row, sr.lora_request)
            if len(sr.token_ids) == 1:
                self.last_token[row] = sr.token_ids[0]
        return np.array(rows, np.int64)

    def prepare(self, out: SchedulerOutput, static: bool = False) -> ModelInputs:
        """The step's tensors; advances every scheduled row's ``num_computed``. ``out`` must not be empty.
        ``static``: the step may run on the runner's graphs: ``self.dispatcher`` picks its path once (a decode
        graph, a prefill graph, eager), and its inputs are staged where that path reads them."""
        srs, bt = out.scheduled, self.block_tables
        for rid, ids in out.new_block_ids.items():
            bt.extend(rid, ids)
        try:
            dec_rows = np.fromiter(map(bt.rows.__getitem__, out.decode_request_ids), np.int64,
                                   len(out.decode_request_ids))
        except KeyError as e:
            raise RuntimeError(f"request {e.args[0]!r} decodes by id, but this runner holds no row for it: a request "
                               "must be sent in full (ScheduledRequest) before it decodes by id") from None
        if not srs:  # decode-only step (the steady state): every row decodes its last sample
            rows = dec_rows[np.argsort(-self.num_computed[dec_rows], kind="stable")]
            query_lens = np.ones(len(rows), np.int64)
            inputs = self._tensors(rows, query_lens, np.ones(len(rows), bool), len(rows), [], static)
            self.num_computed[rows] += 1
            return inputs
        sr_rows = self._admit(srs)
        n_sr = len(srs)
        sr_qlens = np.fromiter(map(len, map(token_ids_of, srs)), np.int64, n_sr)
        sr_sample = np.fromiter(map(_sample, srs), bool, n_sr)
        is_dec = sr_qlens == 1
        # decodes first (by-id rows and one-token full requests), longest context first; prefills in order
        dec_all = np.concatenate([dec_rows, sr_rows[is_dec]])
        order = np.argsort(-self.num_computed[dec_all], kind="stable")
        dec_all = dec_all[order]
        pre = ~is_dec
        rows = np.concatenate([dec_all, sr_rows[pre]])
        query_lens = np.concatenate([np.ones(len(dec_all), np.int64), sr_qlens[pre]])
        sample_mask = np.concatenate([np.concatenate([np.ones(len(dec_rows), bool), sr_sample[is_dec]])[order],
                                      sr_sample[pre]])
        pre_srs = srs if pre.all() else [sr for sr, p in zip(srs, pre.tolist(), strict=True) if p]
        num_decodes = len(dec_all)
        inputs = self._tensors(rows, query_lens, sample_mask, num_decodes, pre_srs, static)
        self.num_computed[rows] += query_lens
        return inputs

    def _tensors(self, rows: np.ndarray, query_lens: np.ndarray, sample_mask: np.ndarray, num_decodes: int,
                 prefills: list[ScheduledRequest], static: bool) -> ModelInputs:
        host = step_arrays(self, rows, query_lens, sample_mask, num_decodes, prefills)
        n, num_tokens, sample_rows = len(rows), host.num_tokens, host.sample_rows
        gather = self._prev_sampled_gather(rows[:num_decodes])
        req_slots = self.loras.slots(rows)  # [n] int32 slot per request, None: no adapter in the step
        static = static and req_slots is None  # steps with an adapter run eagerly (no graph holds the update)
        path = self.dispatcher.dispatch(BatchDescriptor(n, num_tokens, len(sample_rows)), static)
        graph_sampling, graph_answers = None, False
        if path.prefill_size is not None or path.decode_size is not None:
            graph_sampling, graph_answers, settings = self._graph_sampling(sample_rows)
            dev = self._stage_for_graph(path, host, n, gather, settings)
        else:  # eager: the step's one upload
            dev = self._upload(host, gather, req_slots)
        seq_lens, block_tables = host.seq_lens, host.block_tables
        common = CommonAttentionMetadata(
            num_reqs=n, num_decodes=num_decodes, num_actual_tokens=num_tokens,
            max_query_len=int(query_lens.max()), max_seq_len=int(seq_lens.max()), block_size=self.block_size,
            query_start_loc=dev.query_start_loc, seq_lens=dev.seq_lens, block_tables=dev.block_tables,
            slot_mapping=dev.slot_mapping, query_start_loc_cpu=host.query_start_loc.tolist(),
            seq_lens_cpu=seq_lens.tolist(), block_tables_cpu=block_tables,
        )
        if gather:  # decode rows sampled by the previous step, not yet on the host: a device gather
            index, dst = dev.gathered
            dev.input_ids.index_copy_(0, dst, self.prev_sampled[index])
        lora_mapping = None if req_slots is None else self.loras.manager.mapping(req_slots, query_lens, dev.lora_slots,
                                                                                 dev.query_start_loc)
        return ModelInputs(dev.input_ids, dev.positions, common, dev.logits_indices, sample_rows,
                           self.req_ids[sample_rows].tolist(), rows, static_size=path.decode_size,
                           graph_sampling=graph_sampling, prefill_size=path.prefill_size,
                           graph_answers=graph_answers, lora_mapping=lora_mapping)

    def _stage_for_graph(self, path: StepPath, host: StepArrays, n: int, gather: list,
                         settings: tuple | None) -> StepTensors:
        """Write the step straight into the inputs of the graphs ``path`` replays: a one-request prefill graph's
        (prefill_graph.py) or the decode graphs' (static_inputs.py); the views the step reads."""
        num_tokens = host.num_tokens
        if path.prefill_size is not None:  # one request, a short query
            into = self.dispatcher.static.prefill.inputs
            into.stage(path.prefill_size, host.input_ids, host.positions, host.slot_mapping, int(host.seq_lens[0]),
                       host.block_tables[0], settings)
            return StepTensors(into.input_ids[:num_tokens], into.positions[:num_tokens],
                               into.slot_mapping[:num_tokens], None, None, into.seq_lens[:1], into.block_table[:1])
        into = self.dispatcher.static.inputs
        gathered = into.stage(path.decode_size, host.input_ids, host.positions, host.slot_mapping, host.seq_lens,
                              host.block_tables, gather, settings)
        # the decode graph reads neither logits indices nor query_start_loc
        return StepTensors(into.input_ids[:n], into.positions[:n], into.slot_mapping[:n], None, None,
                           into.seq_lens[:n], into.block_table[:n], gathered)

    def _upload(self, host: StepArrays, gather: list, req_slots: np.ndarray | None) -> StepTensors:
        """The eager step's arrays in the step's one upload (``step_upload``)."""
        i64, i32 = np.int64, np.int32
        staged = self.buffers.upload([(host.input_ids, i64), (host.positions, i64), (host.slot_mapping, i64),
                                      (host.logits_indices, i64), (host.query_start_loc, i32), (host.seq_lens, i32),
                                      (host.block_tables, i32), *gather,
                                      *(() if req_slots is None else [(req_slots, i32)])])
        ids, positions, slots, logits, qsl, seq_lens, tables = staged[:7]
        return StepTensors(ids, positions, slots, logits, qsl, seq_lens, tables, staged[7:7 + len(gather)],
                           None if req_slots is None else staged[-1])

    def _graph_sampling(self, rows: np.ndarray) -> tuple[str | None, bool, tuple | None]:
        """A staged step's ``ModelInputs.graph_sampling`` and ``graph_answers``, with the settings to stage."""
        if self.plain_greedy[rows].all():
            return None, True, None
        fixed = fixed_settings([self.params[r] for r in rows.tolist()], self.num_output[rows].tolist(), self.draws)
        return (None, False, None) if fixed is None else (fixed[0], True, fixed[1])

    def sampling_metadata(self, rows: np.ndarray, vocab_size: int, eos_token_ids) -> SamplingMetadata:
        """Sampling settings of ``rows`` (the all-greedy common case costs one array test)."""
        if self.plain_greedy[rows].all():
            return _ALL_GREEDY
        params, num_output = [self.params[r] for r in rows.tolist()], self.num_output[rows]
        md = build_sampling_metadata(params, num_output.tolist(), vocab_size, eos_token_ids, self.device,
                                     self.sampling_upload, self.draws,
                                     self.token_lists.step(rows, num_output, eos_token_ids))
        md.penalties = self.penalties.gather(rows, self.penalized[rows], params, vocab_size)
        return md

    def first_token_index(self, inputs: ModelInputs, request_ids: list[str]) -> dict[str, int]:
        """Where each request's tokens start among the step's tokens (its first row of the hidden states)."""
        step_index = {row: i for i, row in enumerate(inputs.rows.tolist())}
        starts, rows = inputs.common.query_start_loc_cpu, self.block_tables.rows
        return {rid: starts[step_index[rows[rid]]] for rid in request_ids}

    def _prev_sampled_gather(self, decode_rows: np.ndarray) -> list[tuple[np.ndarray, type]]:
        """For decode rows sampled by the previous step whose ids the host does not have yet: (index into its
        sampled tensor, token position) to upload with the step; [] when there are none."""
        if self.prev_sampled is None or not len(decode_rows):
            return []
        src = self.prev_sample[decode_rows]
        dst = np.flatnonzero(src)
        if not len(dst):
            return []
        return [(src[dst] - 1, np.int64), (dst, np.int64)]  # [D'] into prev_sampled, [D'] into input_ids

    def count_samples(self, rows: np.ndarray, tokens: torch.Tensor) -> None:
        """A launched step sampled ``tokens`` [N] (on the device) for ``rows``: they are the rows' next inputs
        until the host records them; the rows' output counts move on now (seeds, min_tokens of the next step)."""
        self.num_output[rows] += 1
        self.penalties.count(rows, self.penalized[rows], tokens)  # on the device: the next step needs no host copy
        self.prev_sample[self._prev_rows] = 0
        self.prev_sample[rows] = np.arange(1, len(rows) + 1)
        self.prev_sampled, self._prev_rows = tokens, rows

    def record_samples(self, rows: np.ndarray, tokens: np.ndarray | torch.Tensor,
                       on_device: torch.Tensor | None = None) -> None:
        """The sampled tokens (on the host) become the rows' next inputs (``on_device``: the tensor they
        came from; if it is still the newest, later steps read the host copy instead)."""
        self.last_token[rows] = np.asarray(tokens)
        if on_device is not None and on_device is self.prev_sampled:
            self.prev_sample[self._prev_rows] = 0
            self.prev_sampled = None


def prepare_inputs(scheduled: list[ScheduledRequest], block_size: int, device: torch.device) -> ModelInputs:
    """The tensors of one step of full requests, from a fresh batch (tests and one-off forwards)."""
    width = max(len(sr.block_ids) for sr in scheduled)
    batch = InputBatch(len(scheduled), width, block_size, device, sum(len(sr.token_ids) for sr in scheduled))
    return batch.prepare(SchedulerOutput(list(scheduled), sum(len(sr.token_ids) for sr in scheduled)))

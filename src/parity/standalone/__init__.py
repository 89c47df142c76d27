"""The standalone vLLM path's parts: pinned replicas behind HTTP (`replicas`), the client that releases a
burst to them (`client`) and the simulator's stand-in for `vllm serve` (`sim_server`). The serving path
that puts them together for a trial is `parity.paths.standalone`."""

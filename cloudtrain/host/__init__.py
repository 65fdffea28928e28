"""The host side: what is shipped to the machine that runs a job and runs there.

Standard library only, Python 3.8+. The orchestrator copies these modules (all but this
file) into `<root>/agent-<version>/` on the host (hosts.agent_files, Host.install_agent) and
runs them there with the host's python3 as plain scripts:

    agent.py              runs one job in tmux, keeps its job directory truthful; probe, stop
      job_queue.py        the jobs queued on a kept instance: the next one started after the
                          job (also run as a command by the CLI: add, state, remove)
      job_status.py       status.json's states, guarded reads of what a job may write
      job_processes.py    the job's processes: alive, signalled, found below the agent, killed
      agent_store.py      the agent's uploads to the job store (checkpoints, results)
    agent_upload.py       the job's files to the S3 job store through a presigned POST
    checkpoint_stream.py  checkpoints to the job store while the job runs; `restore`
      checkpoint_manifest.py  what a snapshot holds, the manifest that names it
      checkpoint_restore.py   a snapshot downloaded, verified and swapped in on a new instance
    stager.py             the job's datasets from S3 onto the host before the job
      stage_plan.py       the plan, checked; how a staging failure is said
      stage_sigv4.py      S3 addresses, SigV4, the instance role's credentials (IMDSv2)
      stage_fetch.py      ranged GETs, bounded in time and retried
      stage_run.py        one dataset's download: fetching workers, extracting finishers
    shards.py             the tar shard format of `cloudtrain data push` (the stager reads it)
    safefile.py           bounded reads that follow no link, atomic writes, folders made
                          without following links

Only the unindented ones are run as commands; the indented ones are imported by the one above.

So a module here imports nothing outside this folder and the standard library
(tests/unit/test_host_package.py checks), and imports its neighbours either way, as part of
this package on the orchestrator or from its own folder on the host:

    try:
        from . import safefile
    except ImportError:
        import safefile

The orchestrator imports from here (never the other way round). This file imports nothing,
so that importing one module does not import the others.
"""

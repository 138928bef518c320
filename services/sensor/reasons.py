"""Pending reasons of every batch system → demand or not. The single source of docs/pending-reasons.md.

Why one table: whether a pending job is *demand* — something a new node could start — decides
whether EPU pays for a VM. A job held by its user, waiting on another job, blocked by a QOS or
association limit, or before its begin time will not start on a new node, so launching for it
wastes money and, worse, the idle node it "needs" is never scaled down. Every native reason is
listed here with its class so an operator can check the mapping against their own cluster, and
a reason missing from the table is *visible*: it counts as **not demand** with a warning (a
cautious default: an unmapped reason costs waiting, never a useless VM).

Classes (``REASON_CLASSES``): ``resources`` and ``priority`` are demand; everything else is not.
The Slurm reasons are every ``job_state_reason`` string of Slurm 22.05, 23.02, 23.11, 24.05 and
24.11 (read from ``job_reason_string()`` / ``job_state_reason.c`` of each release); the note
says which releases know a reason when not all do.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

log = logging.getLogger("epu.sensor.reasons")

#: class → (is demand, meaning)
REASON_CLASSES: dict[str, tuple[bool, str]] = {
    "resources": (True, "waiting for nodes, cores, memory or GPUs: a new node can start it"),
    "priority": (True, "waiting behind other jobs: more nodes let it start sooner"),
    "unknown": (True, "HTCondor: its Requirements name attributes the worker template does not define, "
                      "so EPU cannot tell; counted as demand (it would otherwise never be served)"),
    "held": (False, "held by its user or an administrator"),
    "dependency": (False, "waits for another job"),
    "limit": (False, "blocked by a QOS, association, account, license or array limit: a new node does not lift it"),
    "begin_time": (False, "must not start before a given time"),
    "reservation": (False, "waits for an advanced reservation"),
    "partition": (False, "its partition/queue is down, inactive or forbids it"),
    "invalid": (False, "can never run as submitted (bad account/QOS/constraints, no matching node type)"),
    "starting": (False, "already has its nodes or is being set up/cleaned up"),
    "failure": (False, "requeued after a failure; the batch system decides when it runs again"),
    "unmapped": (False, "a reason this table does not know: not demand, with a warning"),
    "blocked": (False, "not demand, from a sender that reads job by job and says only 'blocked' (simulated batch)"),
}

# ------------------------------------------------------------------ Slurm (state_reason)
#: native reason → (class, "ENUM: note")
SLURM_REASONS: dict[str, tuple[str, str]] = {
    "InvalidAccount": ("invalid", "FAIL_ACCOUNT: invalid account"),
    "BadConstraints": ("invalid", "FAIL_BAD_CONSTRAINTS: its constraints match no node in the configuration"),
    "BurstBufferOperation": ("failure", "FAIL_BURST_BUFFER_OP: burst buffer operation failed"),
    "Constraints": ("invalid", "FAIL_CONSTRAINTS: its constraints cannot be satisfied (23.11+)"),
    "DeadLine": ("failure", "FAIL_DEADLINE: deadline reached"),
    "SchedDefer": ("priority", "FAIL_DEFER: scheduling deferred (SchedulerParameters=defer)"),
    "NodeDown": ("resources", "FAIL_DOWN_NODE: a node it needs is down"),
    "PartitionDown": ("partition", "FAIL_DOWN_PARTITION: partition is down"),
    "NonZeroExitCode": ("failure", "FAIL_EXIT_CODE: previous run exited non-zero (requeued)"),
    "InactiveLimit": ("failure", "FAIL_INACTIVE_LIMIT: previous run hit the inactive limit (requeued)"),
    "JobLaunchFailure": ("failure", "FAIL_LAUNCH: launch failed (requeued)"),
    "OutOfMemory": ("failure", "FAIL_OOM: previous run ran out of memory (requeued; 23.02+)"),
    "InvalidQOS": ("invalid", "FAIL_QOS: invalid QOS"),
    "RaisedSignal": ("failure", "FAIL_SIGNAL: previous run got a signal (requeued; 23.02+)"),
    "SystemFailure": ("failure", "FAIL_SYSTEM: system failure (requeued)"),
    "TimeLimit": ("failure", "FAIL_TIMEOUT: previous run hit its time limit (requeued)"),
    "AccountNotAllowed": ("invalid", "WAIT_ACCOUNT: account not allowed in this partition"),
    "AccountingPolicy": ("limit", "WAIT_ACCOUNT_POLICY: accounting policy limit"),
    "JobArrayTaskLimit": ("limit", "WAIT_ARRAY_TASK_LIMIT: array task limit (--array=...%N) reached"),
    "AssocGrpBB": ("limit", "WAIT_ASSOC_GRP_BB: association limit"),
    "AssocGrpBBMinutes": ("limit", "WAIT_ASSOC_GRP_BB_MIN: association limit"),
    "AssocGrpBBRunMinutes": ("limit", "WAIT_ASSOC_GRP_BB_RUN_MIN: association limit"),
    "AssocGrpBilling": ("limit", "WAIT_ASSOC_GRP_BILLING: association limit"),
    "AssocGrpBillingMinutes": ("limit", "WAIT_ASSOC_GRP_BILLING_MIN: association limit"),
    "AssocGrpBillingRunMinutes": ("limit", "WAIT_ASSOC_GRP_BILLING_RUN_MIN: association limit"),
    "AssocGrpCpuLimit": ("limit", "WAIT_ASSOC_GRP_CPU: association limit"),
    "AssocGrpCPUMinutesLimit": ("limit", "WAIT_ASSOC_GRP_CPU_MIN: association limit"),
    "AssocGrpCPURunMinutesLimit": ("limit", "WAIT_ASSOC_GRP_CPU_RUN_MIN: association limit"),
    "AssocGrpEnergy": ("limit", "WAIT_ASSOC_GRP_ENERGY: association limit"),
    "AssocGrpEnergyMinutes": ("limit", "WAIT_ASSOC_GRP_ENERGY_MIN: association limit"),
    "AssocGrpEnergyRunMinutes": ("limit", "WAIT_ASSOC_GRP_ENERGY_RUN_MIN: association limit"),
    "AssocGrpGRES": ("limit", "WAIT_ASSOC_GRP_GRES: association limit"),
    "AssocGrpGRESMinutes": ("limit", "WAIT_ASSOC_GRP_GRES_MIN: association limit"),
    "AssocGrpGRESRunMinutes": ("limit", "WAIT_ASSOC_GRP_GRES_RUN_MIN: association limit"),
    "AssocGrpJobsLimit": ("limit", "WAIT_ASSOC_GRP_JOB: association limit"),
    "AssocGrpLicense": ("limit", "WAIT_ASSOC_GRP_LIC: association limit"),
    "AssocGrpLicenseMinutes": ("limit", "WAIT_ASSOC_GRP_LIC_MIN: association limit"),
    "AssocGrpLicenseRunMinutes": ("limit", "WAIT_ASSOC_GRP_LIC_RUN_MIN: association limit"),
    "AssocGrpMemLimit": ("limit", "WAIT_ASSOC_GRP_MEM: association limit"),
    "AssocGrpMemMinutes": ("limit", "WAIT_ASSOC_GRP_MEM_MIN: association limit"),
    "AssocGrpMemRunMinutes": ("limit", "WAIT_ASSOC_GRP_MEM_RUN_MIN: association limit"),
    "AssocGrpNodeLimit": ("limit", "WAIT_ASSOC_GRP_NODE: association limit"),
    "AssocGrpNodeMinutes": ("limit", "WAIT_ASSOC_GRP_NODE_MIN: association limit"),
    "AssocGrpNodeRunMinutes": ("limit", "WAIT_ASSOC_GRP_NODE_RUN_MIN: association limit"),
    "AssocGrpSubmitJobsLimit": ("limit", "WAIT_ASSOC_GRP_SUB_JOB: association limit"),
    "AssocGrpUnknown": ("limit", "WAIT_ASSOC_GRP_UNK: association limit"),
    "AssocGrpUnknownMinutes": ("limit", "WAIT_ASSOC_GRP_UNK_MIN: association limit"),
    "AssocGrpUnknownRunMinutes": ("limit", "WAIT_ASSOC_GRP_UNK_RUN_MIN: association limit"),
    "AssocGrpWallLimit": ("limit", "WAIT_ASSOC_GRP_WALL: association limit"),
    "AssociationJobLimit": ("limit", "WAIT_ASSOC_JOB_LIMIT: association limit"),
    "AssocMaxBBPerJob": ("limit", "WAIT_ASSOC_MAX_BB_PER_JOB: association limit"),
    "AssocMaxBBPerNode": ("limit", "WAIT_ASSOC_MAX_BB_PER_NODE: association limit"),
    "AssocMaxBillingMinutesPerJob": ("limit", "WAIT_ASSOC_MAX_BILLING_MINS_PER_JOB: association limit"),
    "AssocMaxBillingPerJob": ("limit", "WAIT_ASSOC_MAX_BILLING_PER_JOB: association limit"),
    "AssocMaxBillingPerNode": ("limit", "WAIT_ASSOC_MAX_BILLING_PER_NODE: association limit"),
    "AssocMaxCpuMinutesPerJobLimit": ("limit", "WAIT_ASSOC_MAX_CPU_MINS_PER_JOB: association limit"),
    "AssocMaxCpuPerJobLimit": ("limit", "WAIT_ASSOC_MAX_CPU_PER_JOB: association limit"),
    "AssocMaxCpuPerNode": ("limit", "WAIT_ASSOC_MAX_CPU_PER_NODE: association limit"),
    "AssocMaxEnergyMinutesPerJob": ("limit", "WAIT_ASSOC_MAX_ENERGY_MINS_PER_JOB: association limit"),
    "AssocMaxEnergyPerJob": ("limit", "WAIT_ASSOC_MAX_ENERGY_PER_JOB: association limit"),
    "AssocMaxEnergyPerNode": ("limit", "WAIT_ASSOC_MAX_ENERGY_PER_NODE: association limit"),
    "AssocMaxGRESMinutesPerJob": ("limit", "WAIT_ASSOC_MAX_GRES_MINS_PER_JOB: association limit"),
    "AssocMaxGRESPerJob": ("limit", "WAIT_ASSOC_MAX_GRES_PER_JOB: association limit"),
    "AssocMaxGRESPerNode": ("limit", "WAIT_ASSOC_MAX_GRES_PER_NODE: association limit"),
    "AssocMaxJobsLimit": ("limit", "WAIT_ASSOC_MAX_JOBS: association limit"),
    "AssocMaxLicenseMinutesPerJob": ("limit", "WAIT_ASSOC_MAX_LIC_MINS_PER_JOB: association limit"),
    "AssocMaxLicensePerJob": ("limit", "WAIT_ASSOC_MAX_LIC_PER_JOB: association limit"),
    "AssocMaxMemMinutesPerJob": ("limit", "WAIT_ASSOC_MAX_MEM_MINS_PER_JOB: association limit"),
    "AssocMaxMemPerJob": ("limit", "WAIT_ASSOC_MAX_MEM_PER_JOB: association limit"),
    "AssocMaxMemPerNode": ("limit", "WAIT_ASSOC_MAX_MEM_PER_NODE: association limit"),
    "AssocMaxNodeMinutesPerJob": ("limit", "WAIT_ASSOC_MAX_NODE_MINS_PER_JOB: association limit"),
    "AssocMaxNodePerJobLimit": ("limit", "WAIT_ASSOC_MAX_NODE_PER_JOB: association limit"),
    "AssocMaxSubmitJobLimit": ("limit", "WAIT_ASSOC_MAX_SUB_JOB: association limit"),
    "AssocMaxUnknownMinutesPerJob": ("limit", "WAIT_ASSOC_MAX_UNK_MINS_PER_JOB: association limit"),
    "AssocMaxUnknownPerJob": ("limit", "WAIT_ASSOC_MAX_UNK_PER_JOB: association limit"),
    "AssocMaxUnknownPerNode": ("limit", "WAIT_ASSOC_MAX_UNK_PER_NODE: association limit"),
    "AssocMaxWallDurationPerJobLimit": ("limit", "WAIT_ASSOC_MAX_WALL_PER_JOB: association limit"),
    "AssociationResourceLimit": ("limit", "WAIT_ASSOC_RESOURCE_LIMIT: association limit"),
    "AssociationTimeLimit": ("limit", "WAIT_ASSOC_TIME_LIMIT: association limit"),
    "BlockFreeAction": ("failure", "WAIT_BLOCK_D_ACTION: BlueGene block being freed (22.05 only)"),
    "BlockMaxError": ("failure", "WAIT_BLOCK_MAX_ERR: BlueGene block errors (22.05 only)"),
    "BurstBufferResources": ("limit", "WAIT_BURST_BUFFER_RESOURCE: waits for burst buffer space"),
    "BurstBufferStageIn": ("starting", "WAIT_BURST_BUFFER_STAGING: burst buffer stage-in running"),
    "Cleaning": ("starting", "WAIT_CLEANING: requeued, previous run still cleaning up"),
    "Dependency": ("dependency", "WAIT_DEPENDENCY: waits for another job"),
    "DependencyNeverSatisfied": ("dependency", "WAIT_DEP_INVALID: its dependency can never be satisfied"),
    "FedJobLock": ("starting", "WAIT_FED_JOB_LOCK: federation lock held briefly"),
    "FrontEndDown": ("partition", "WAIT_FRONT_END: no front end node available"),
    "JobHeldAdmin": ("held", "WAIT_HELD: held by an administrator"),
    "JobHeldUser": ("held", "WAIT_HELD_USER: held by its user"),
    "Licenses": ("limit", "WAIT_LICENSES: waits for licenses: a new node brings none"),
    "MaxPoweredUpNodes": ("limit", "WAIT_MAX_POWERED_NODES: Slurm's MaxPoweredUpNodes reached (24.05+)"),
    "JobHoldMaxRequeue": ("held", "WAIT_MAX_REQUEUE: held after too many requeues"),
    "MpiPortsBusy": ("resources", "WAIT_MPI_PORTS_BUSY: MPI ports busy on the nodes (24.05+)"),
    "ReqNodeNotAvail": ("resources", "WAIT_NODE_NOT_AVAIL: required nodes not available (down, drained, reserved — e.g. EPU's drained pool slots)"),
    "None": ("priority", "WAIT_NO_REASON: just submitted, not yet evaluated by the scheduler"),
    "PartitionConfig": ("partition", "WAIT_PART_CONFIG: partition configuration forbids it (23.02+)"),
    "PartitionInactive": ("partition", "WAIT_PART_INACTIVE: partition is inactive"),
    "PartitionNodeLimit": ("resources", "WAIT_PART_NODE_LIMIT: outside the partition's current node limits, or its nodes are down/drained (pool slots count here)"),
    "PartitionTimeLimit": ("partition", "WAIT_PART_TIME_LIMIT: time limit above the partition's MaxTime: never runs there"),
    "MaxMemPerLimit": ("limit", "WAIT_PN_MEM_LIMIT: memory above MaxMemPerCPU/Node"),
    "PowerNotAvail": ("limit", "WAIT_POWER_NOT_AVAIL: power capping: not enough power (to 23.11) (22.05–23.11)"),
    "PowerReserved": ("limit", "WAIT_POWER_RESERVED: power reserved (to 23.11) (22.05–23.11)"),
    "Priority": ("priority", "WAIT_PRIORITY: higher-priority jobs go first; more nodes let it start sooner"),
    "Prolog": ("starting", "WAIT_PROLOG: nodes allocated, prolog running: it has its nodes"),
    "QOSNotAllowed": ("invalid", "WAIT_QOS: QOS not allowed for this job/partition"),
    "QOSGrpBB": ("limit", "WAIT_QOS_GRP_BB: QOS limit"),
    "QOSGrpBBMinutes": ("limit", "WAIT_QOS_GRP_BB_MIN: QOS limit"),
    "QOSGrpBBRunMinutes": ("limit", "WAIT_QOS_GRP_BB_RUN_MIN: QOS limit"),
    "QOSGrpBilling": ("limit", "WAIT_QOS_GRP_BILLING: QOS limit"),
    "QOSGrpBillingMinutes": ("limit", "WAIT_QOS_GRP_BILLING_MIN: QOS limit"),
    "QOSGrpBillingRunMinutes": ("limit", "WAIT_QOS_GRP_BILLING_RUN_MIN: QOS limit"),
    "QOSGrpCpuLimit": ("limit", "WAIT_QOS_GRP_CPU: QOS limit"),
    "QOSGrpCPUMinutesLimit": ("limit", "WAIT_QOS_GRP_CPU_MIN: QOS limit"),
    "QOSGrpCPURunMinutesLimit": ("limit", "WAIT_QOS_GRP_CPU_RUN_MIN: QOS limit"),
    "QOSGrpEnergy": ("limit", "WAIT_QOS_GRP_ENERGY: QOS limit"),
    "QOSGrpEnergyMinutes": ("limit", "WAIT_QOS_GRP_ENERGY_MIN: QOS limit"),
    "QOSGrpEnergyRunMinutes": ("limit", "WAIT_QOS_GRP_ENERGY_RUN_MIN: QOS limit"),
    "QOSGrpGRES": ("limit", "WAIT_QOS_GRP_GRES: QOS limit"),
    "QOSGrpGRESMinutes": ("limit", "WAIT_QOS_GRP_GRES_MIN: QOS limit"),
    "QOSGrpGRESRunMinutes": ("limit", "WAIT_QOS_GRP_GRES_RUN_MIN: QOS limit"),
    "QOSGrpJobsLimit": ("limit", "WAIT_QOS_GRP_JOB: QOS limit"),
    "QOSGrpLicense": ("limit", "WAIT_QOS_GRP_LIC: QOS limit"),
    "QOSGrpLicenseMinutes": ("limit", "WAIT_QOS_GRP_LIC_MIN: QOS limit"),
    "QOSGrpLicenseRunMinutes": ("limit", "WAIT_QOS_GRP_LIC_RUN_MIN: QOS limit"),
    "QOSGrpMemLimit": ("limit", "WAIT_QOS_GRP_MEM: QOS limit"),
    "QOSGrpMemoryMinutes": ("limit", "WAIT_QOS_GRP_MEM_MIN: QOS limit"),
    "QOSGrpMemoryRunMinutes": ("limit", "WAIT_QOS_GRP_MEM_RUN_MIN: QOS limit"),
    "QOSGrpNodeLimit": ("limit", "WAIT_QOS_GRP_NODE: QOS limit"),
    "QOSGrpNodeMinutes": ("limit", "WAIT_QOS_GRP_NODE_MIN: QOS limit"),
    "QOSGrpNodeRunMinutes": ("limit", "WAIT_QOS_GRP_NODE_RUN_MIN: QOS limit"),
    "QOSGrpSubmitJobsLimit": ("limit", "WAIT_QOS_GRP_SUB_JOB: QOS limit"),
    "QOSGrpUnknown": ("limit", "WAIT_QOS_GRP_UNK: QOS limit"),
    "QOSGrpUnknownMinutes": ("limit", "WAIT_QOS_GRP_UNK_MIN: QOS limit"),
    "QOSGrpUnknownRunMinutes": ("limit", "WAIT_QOS_GRP_UNK_RUN_MIN: QOS limit"),
    "QOSGrpWallLimit": ("limit", "WAIT_QOS_GRP_WALL: QOS limit"),
    "QOSJobLimit": ("limit", "WAIT_QOS_JOB_LIMIT: QOS limit"),
    "AssocMaxBBMinutesPerJob": ("limit", "WAIT_QOS_MAX_BB_MINS_PER_JOB: QOS limit"),
    "MaxBBPerAccount": ("limit", "WAIT_QOS_MAX_BB_PER_ACCT: QOS limit"),
    "QOSMaxBBPerJob": ("limit", "WAIT_QOS_MAX_BB_PER_JOB: QOS limit"),
    "QOSMaxBBPerNode": ("limit", "WAIT_QOS_MAX_BB_PER_NODE: QOS limit"),
    "QOSMaxBBPerUser": ("limit", "WAIT_QOS_MAX_BB_PER_USER: QOS limit"),
    "MaxBBRunMinsPerAccount": ("limit", "WAIT_QOS_MAX_BB_RUN_MINS_PER_ACCT: QOS limit (24.05+)"),
    "MaxBBRunMinsPerUser": ("limit", "WAIT_QOS_MAX_BB_RUN_MINS_PER_USER: QOS limit (24.05+)"),
    "QOSMaxBillingMinutesPerJob": ("limit", "WAIT_QOS_MAX_BILLING_MINS_PER_JOB: QOS limit"),
    "MaxBillingPerAccount": ("limit", "WAIT_QOS_MAX_BILLING_PER_ACCT: QOS limit"),
    "QOSMaxBillingPerJob": ("limit", "WAIT_QOS_MAX_BILLING_PER_JOB: QOS limit"),
    "QOSMaxBillingPerNode": ("limit", "WAIT_QOS_MAX_BILLING_PER_NODE: QOS limit"),
    "QOSMaxBillingPerUser": ("limit", "WAIT_QOS_MAX_BILLING_PER_USER: QOS limit"),
    "MaxBillingRunMinsPerAccount": ("limit", "WAIT_QOS_MAX_BILLING_RUN_MINS_PER_ACCT: QOS limit (24.05+)"),
    "MaxBillingRunMinsPerUser": ("limit", "WAIT_QOS_MAX_BILLING_RUN_MINS_PER_USER: QOS limit (24.05+)"),
    "QOSMaxCpuMinutesPerJobLimit": ("limit", "WAIT_QOS_MAX_CPU_MINS_PER_JOB: QOS limit"),
    "MaxCpuPerAccount": ("limit", "WAIT_QOS_MAX_CPU_PER_ACCT: QOS limit"),
    "QOSMaxCpuPerJobLimit": ("limit", "WAIT_QOS_MAX_CPU_PER_JOB: QOS limit"),
    "QOSMaxCpuPerNode": ("limit", "WAIT_QOS_MAX_CPU_PER_NODE: QOS limit"),
    "QOSMaxCpuPerUserLimit": ("limit", "WAIT_QOS_MAX_CPU_PER_USER: QOS limit"),
    "MaxCpuRunMinsPerAccount": ("limit", "WAIT_QOS_MAX_CPU_RUN_MINS_PER_ACCT: QOS limit (24.05+)"),
    "MaxCpuRunMinsPerUser": ("limit", "WAIT_QOS_MAX_CPU_RUN_MINS_PER_USER: QOS limit (24.05+)"),
    "QOSMaxEnergyMinutesPerJob": ("limit", "WAIT_QOS_MAX_ENERGY_MINS_PER_JOB: QOS limit"),
    "MaxEnergyPerAccount": ("limit", "WAIT_QOS_MAX_ENERGY_PER_ACCT: QOS limit"),
    "QOSMaxEnergyPerJob": ("limit", "WAIT_QOS_MAX_ENERGY_PER_JOB: QOS limit"),
    "QOSMaxEnergyPerNode": ("limit", "WAIT_QOS_MAX_ENERGY_PER_NODE: QOS limit"),
    "QOSMaxEnergyPerUser": ("limit", "WAIT_QOS_MAX_ENERGY_PER_USER: QOS limit"),
    "MaxEnergyRunMinsPerAccount": ("limit", "WAIT_QOS_MAX_ENERGY_RUN_MINS_PER_ACCT: QOS limit (24.05+)"),
    "MaxEnergyRunMinsPerUser": ("limit", "WAIT_QOS_MAX_ENERGY_RUN_MINS_PER_USER: QOS limit (24.05+)"),
    "QOSMaxGRESMinutesPerJob": ("limit", "WAIT_QOS_MAX_GRES_MINS_PER_JOB: QOS limit"),
    "MaxGRESPerAccount": ("limit", "WAIT_QOS_MAX_GRES_PER_ACCT: QOS limit"),
    "QOSMaxGRESPerJob": ("limit", "WAIT_QOS_MAX_GRES_PER_JOB: QOS limit"),
    "QOSMaxGRESPerNode": ("limit", "WAIT_QOS_MAX_GRES_PER_NODE: QOS limit"),
    "QOSMaxGRESPerUser": ("limit", "WAIT_QOS_MAX_GRES_PER_USER: QOS limit"),
    "MaxGRESRunMinsPerAccount": ("limit", "WAIT_QOS_MAX_GRES_RUN_MINS_PER_ACCT: QOS limit (24.05+)"),
    "MaxGRESRunMinsPerUser": ("limit", "WAIT_QOS_MAX_GRES_RUN_MINS_PER_USER: QOS limit (24.05+)"),
    "MaxJobsPerAccount": ("limit", "WAIT_QOS_MAX_JOB_PER_ACCT: QOS limit"),
    "QOSMaxJobsPerUserLimit": ("limit", "WAIT_QOS_MAX_JOB_PER_USER: QOS limit"),
    "QOSMaxLicenseMinutesPerJob": ("limit", "WAIT_QOS_MAX_LIC_MINS_PER_JOB: QOS limit"),
    "MaxLicensePerAccount": ("limit", "WAIT_QOS_MAX_LIC_PER_ACCT: QOS limit"),
    "QOSMaxLicensePerJob": ("limit", "WAIT_QOS_MAX_LIC_PER_JOB: QOS limit"),
    "QOSMaxLicensePerUser": ("limit", "WAIT_QOS_MAX_LIC_PER_USER: QOS limit"),
    "MaxLicenseRunMinsPerAccount": ("limit", "WAIT_QOS_MAX_LIC_RUN_MINS_PER_ACCT: QOS limit (24.05+)"),
    "MaxLicenseRunMinsPerUser": ("limit", "WAIT_QOS_MAX_LIC_RUN_MINS_PER_USER: QOS limit (24.05+)"),
    "QOSMaxMemoryMinutesPerJob": ("limit", "WAIT_QOS_MAX_MEM_MINS_PER_JOB: QOS limit"),
    "MaxMemoryPerAccount": ("limit", "WAIT_QOS_MAX_MEM_PER_ACCT: QOS limit"),
    "QOSMaxMemoryPerJob": ("limit", "WAIT_QOS_MAX_MEM_PER_JOB: QOS limit"),
    "QOSMaxMemoryPerNode": ("limit", "WAIT_QOS_MAX_MEM_PER_NODE: QOS limit"),
    "QOSMaxMemoryPerUser": ("limit", "WAIT_QOS_MAX_MEM_PER_USER: QOS limit"),
    "MaxMemoryRunMinsPerAccount": ("limit", "WAIT_QOS_MAX_MEM_RUN_MINS_PER_ACCT: QOS limit (24.05+)"),
    "MaxMemoryRunMinsPerUser": ("limit", "WAIT_QOS_MAX_MEM_RUN_MINS_PER_USER: QOS limit (24.05+)"),
    "QOSMaxNodeMinutesPerJob": ("limit", "WAIT_QOS_MAX_NODE_MINS_PER_JOB: QOS limit"),
    "MaxNodePerAccount": ("limit", "WAIT_QOS_MAX_NODE_PER_ACCT: QOS limit"),
    "QOSMaxNodePerJobLimit": ("limit", "WAIT_QOS_MAX_NODE_PER_JOB: QOS limit"),
    "QOSMaxNodePerUserLimit": ("limit", "WAIT_QOS_MAX_NODE_PER_USER: QOS limit"),
    "MaxNodeRunMinsPerAccount": ("limit", "WAIT_QOS_MAX_NODE_RUN_MINS_PER_ACCT: QOS limit (24.05+)"),
    "MaxNodeRunMinsPerUser": ("limit", "WAIT_QOS_MAX_NODE_RUN_MINS_PER_USER: QOS limit (24.05+)"),
    "QOSMaxSubmitJobPerUserLimit": ("limit", "WAIT_QOS_MAX_SUB_JOB: QOS limit"),
    "MaxSubmitJobsPerAccount": ("limit", "WAIT_QOS_MAX_SUB_JOB_PER_ACCT: QOS limit"),
    "QOSMaxUnknownMinutesPerJob": ("limit", "WAIT_QOS_MAX_UNK_MINS_PER_JOB: QOS limit"),
    "MaxUnknownPerAccount": ("limit", "WAIT_QOS_MAX_UNK_PER_ACCT: QOS limit"),
    "QOSMaxUnknownPerJob": ("limit", "WAIT_QOS_MAX_UNK_PER_JOB: QOS limit"),
    "QOSMaxUnknownPerNode": ("limit", "WAIT_QOS_MAX_UNK_PER_NODE: QOS limit"),
    "QOSMaxUnknownPerUser": ("limit", "WAIT_QOS_MAX_UNK_PER_USER: QOS limit"),
    "MaxUnknownRunMinsPerAccount": ("limit", "WAIT_QOS_MAX_UNK_RUN_MINS_PER_ACCT: QOS limit (24.05+)"),
    "MaxUnknownRunMinsPerUser": ("limit", "WAIT_QOS_MAX_UNK_RUN_MINS_PER_USER: QOS limit (24.05+)"),
    "QOSMaxWallDurationPerJobLimit": ("limit", "WAIT_QOS_MAX_WALL_PER_JOB: QOS limit"),
    "QOSMinBB": ("limit", "WAIT_QOS_MIN_BB: QOS limit"),
    "QOSMinBilling": ("limit", "WAIT_QOS_MIN_BILLING: QOS limit"),
    "QOSMinCpuNotSatisfied": ("limit", "WAIT_QOS_MIN_CPU: QOS limit"),
    "QOSMinEnergy": ("limit", "WAIT_QOS_MIN_ENERGY: QOS limit"),
    "QOSMinGRES": ("limit", "WAIT_QOS_MIN_GRES: QOS limit"),
    "QOSMinLicense": ("limit", "WAIT_QOS_MIN_LIC: QOS limit"),
    "QOSMinMemory": ("limit", "WAIT_QOS_MIN_MEM: QOS limit"),
    "QOSMinNode": ("limit", "WAIT_QOS_MIN_NODE: QOS limit"),
    "QOSMinUnknown": ("limit", "WAIT_QOS_MIN_UNK: QOS limit"),
    "QOSResourceLimit": ("limit", "WAIT_QOS_RESOURCE_LIMIT: QOS limit"),
    "QOSUsageThreshold": ("limit", "WAIT_QOS_THRES: QOS limit"),
    "QOSTimeLimit": ("limit", "WAIT_QOS_TIME_LIMIT: QOS limit"),
    "Reservation": ("reservation", "WAIT_RESERVATION: waits for its advanced reservation to start"),
    "Resources": ("resources", "WAIT_RESOURCES: waiting for nodes/cores/memory/GPUs: the demand EPU serves"),
    "ReservationDeleted": ("invalid", "WAIT_RESV_DELETED: its reservation was deleted"),
    "ReservationInvalid": ("invalid", "WAIT_RESV_INVALID: its reservation is invalid (23.11+)"),
    "BeginTime": ("begin_time", "WAIT_TIME: --begin in the future"),
}


# ------------------------------------------------------------------ Torque (job_state, Hold_Types, depend)
#: Torque has no pending-reason field: the reason is the job state, refined for holds by
#: ``Hold_Types`` (``H/u`` user, ``H/o`` operator, ``H/s`` system, ``H/p`` bad password) and by
#: ``depend`` (a held job with a dependency is ``H/depend``).
TORQUE_REASONS: dict[str, tuple[str, str]] = {
    "Q": ("resources", "queued: eligible to run"),
    "T": ("resources", "in transit to its execution queue"),
    "W": ("begin_time", "waiting for its execution time (qsub -a)"),
    "H/u": ("held", "user hold (qhold, qsub -h)"),
    "H/o": ("held", "operator hold"),
    "H/s": ("held", "system hold"),
    "H/p": ("held", "bad password hold"),
    "H/depend": ("dependency", "held until its dependency (depend attribute) is satisfied"),
    "H": ("held", "held, hold type not reported"),
}

# ------------------------------------------------------------------ HTCondor (JobStatus and the template match)
HTCONDOR_REASONS: dict[str, tuple[str, str]] = {
    "Idle": ("resources", "JobStatus 1: idle, waiting for a matching slot"),
    "RequirementsUnknown": ("unknown", "JobStatus 1, but its Requirements name machine attributes the "
                                       "configured worker template does not define"),
    "RequirementsUnmatched": ("invalid", "JobStatus 1, but its Requirements are false for the worker template: "
                                         "a new worker could never run it"),
    "Deferred": ("begin_time", "JobStatus 1 with DeferralTime in the future"),
    "Held": ("held", "JobStatus 5 (HoldReasonCode/HoldReason say why)"),
}

TABLES: dict[str, dict[str, tuple[str, str]]] = {
    "slurm": SLURM_REASONS, "torque": TORQUE_REASONS, "htcondor": HTCONDOR_REASONS,
}


@dataclass(frozen=True)
class Verdict:
    """What a native reason means for demand."""

    reason: str
    """The native reason, cleaned (``ReqNodeNotAvail, UnavailableNodes:x`` → ``ReqNodeNotAvail``)."""
    reason_class: str
    demand: bool


_SLURM_REASON_HEAD = re.compile(r"[^,(\s]+")


def clean_reason(system: str, native: str) -> str:
    """The reason word a table is keyed by. Slurm's text output prints ``state_desc`` when set
    (``ReqNodeNotAvail, UnavailableNodes:el[1-2]``); the reason is its first word."""
    text = (native or "").strip()
    if system == "slurm":
        m = _SLURM_REASON_HEAD.match(text)
        return m.group(0) if m else "None"
    return text


def classify(system: str, native: str, warnings: list[str] | None = None) -> Verdict:
    """Map one native reason to its class; unmapped → not demand, with a warning."""
    reason = clean_reason(system, native)
    entry = TABLES[system].get(reason)
    if entry is None:
        msg = (f"{system}: unmapped pending reason {native!r}: counted as not demand — add it to "
               "services/sensor/reasons.py")
        log.warning(msg)
        if warnings is not None:
            warnings.append(msg)
        return Verdict(reason, "unmapped", False)
    cls = entry[0]
    return Verdict(reason, cls, REASON_CLASSES[cls][0])


class ReasonCache:
    """``classify`` memoized per read: 100,000 pending jobs have a handful of distinct reasons,
    and an unmapped one is warned about once per read, not once per job."""

    def __init__(self, system: str, warnings: list[str] | None = None) -> None:
        self.system = system
        self.warnings = warnings
        self._seen: dict[str, Verdict] = {}

    def __call__(self, native: str) -> Verdict:
        v = self._seen.get(native)
        if v is None:
            v = self._seen[native] = classify(self.system, native, self.warnings)
        return v

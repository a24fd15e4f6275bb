// JobSet (jobset.x-k8s.io/v1alpha2) as TypeScript interfaces, written for
// check.js from the API types JobSet publishes (kubernetes-sigs/jobset,
// api/jobset/v1alpha2/jobset_types.go): the fields a manifest may set
// (no status). check.js type-checks every rendered JobSet as an object
// literal of IJobSet: unknown or misspelled fields fail at any depth, the
// embedded Job templates through the kubernetes-models batch/v1 types.
// v1alpha2.schema.json holds what types cannot say (int32 ranges,
// patterns, required fields in arrays); keep the two in step.
import type { IIoK8sApimachineryPkgApisMetaV1ObjectMeta as IObjectMeta } from "@kubernetes-models/apimachinery/apis/meta/v1/ObjectMeta";
import type { IJobTemplateSpec } from "kubernetes-models/batch/v1/JobTemplateSpec";
import type { IPersistentVolumeClaim } from "kubernetes-models/v1/PersistentVolumeClaim";

export interface IJobSet {
  apiVersion: "jobset.x-k8s.io/v1alpha2";
  kind: "JobSet";
  metadata?: IObjectMeta;
  spec?: IJobSetSpec;
}

export interface IJobSetSpec {
  replicatedJobs?: IReplicatedJob[];
  network?: INetwork;
  successPolicy?: ISuccessPolicy;
  failurePolicy?: IFailurePolicy;
  // Deprecated upstream in favour of dependsOn; exclusive with it.
  startupPolicy?: IStartupPolicy;
  suspend?: boolean;
  coordinator?: ICoordinator;
  managedBy?: string;
  ttlSecondsAfterFinished?: number;
  volumeClaimPolicies?: IVolumeClaimPolicy[];
}

export interface IReplicatedJob {
  name: string;
  groupName?: string;
  template: IJobTemplateSpec;
  replicas?: number;
  dependsOn?: IDependsOn[];
}

export interface IDependsOn {
  name: string;
  status: "Ready" | "Complete";
}

export interface INetwork {
  enableDNSHostnames?: boolean;
  subdomain?: string;
  publishNotReadyAddresses?: boolean;
}

export type Operator = "All" | "Any";

export interface ISuccessPolicy {
  operator: Operator;
  targetReplicatedJobs?: string[];
}

export type FailurePolicyAction =
  | "FailJobSet"
  | "RestartJobSet"
  | "RestartJobSetAndIgnoreMaxRestarts"
  | "RestartJob"
  | "RestartJobAndIgnoreMaxRestarts";

export interface IFailurePolicyRule {
  name: string;
  action: FailurePolicyAction;
  onJobFailureReasons?: string[];
  onJobFailureMessagePatterns?: string[];
  targetReplicatedJobs?: string[];
}

export interface IFailurePolicy {
  maxRestarts?: number;
  restartStrategy?: "Recreate" | "BlockingRecreate" | "InPlaceRestart";
  rules?: IFailurePolicyRule[];
}

export interface IStartupPolicy {
  startupPolicyOrder: "AnyOrder" | "InOrder";
}

export interface ICoordinator {
  replicatedJob: string;
  jobIndex?: number;
  podIndex?: number;
}

export interface IVolumeClaimPolicy {
  templates?: IPersistentVolumeClaim[];
  retentionPolicy?: { whenDeleted?: "Delete" | "Retain" };
}

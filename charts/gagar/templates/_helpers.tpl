{{/* Chart name, truncated to a DNS label. */}}
{{- define "gagar.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, with the chart name unless the release already contains it. */}}
{{- define "gagar.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "gagar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gagar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "gagar.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 }}
{{ include "gagar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gagar
{{- end }}

{{- define "gagar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gagar.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gagar.image" -}}
{{- $repository := .Values.operator.image.repository }}
{{- if and .Values.image.registry (eq $repository "ghcr.io/gagar-dev/gagar-operator") }}
{{- $repository = printf "%s/gagar-operator" (trimSuffix "/" .Values.image.registry) }}
{{- end }}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.operator.image.tag) }}
{{- end }}

{{/*
The operator's RBAC rules: what it reads and what it creates for each GagarRun, nothing more.
No Secrets, no wildcards, no escalate/bind/impersonate. The Roles it creates for run
ServiceAccounts grant a subset of these (Kubernetes forbids granting what the operator lacks).
*/}}
{{- define "gagar.rules" -}}
- apiGroups: ["gagar.dev"]
  resources: ["gagarruns"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["gagar.dev"]
  resources: ["gagarruns/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["gagar.dev"]
  resources: ["gagarruns/finalizers"]
  verbs: ["update"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments/scale"]
  verbs: ["get", "update", "patch"]
- apiGroups: [""]
  resources: ["services", "configmaps", "serviceaccounts", "persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
# a namespace's ResourceQuotas: limits.cpu/limits.memory make every container state a limit
- apiGroups: [""]
  resources: ["resourcequotas"]
  verbs: ["list"]
# a run's weight-sync token, made once: create only, so the operator can read no Secret
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
{{- if .Values.podSecurity.runSecretLabel }}
# podSecurity.runSecretLabel: the operator reads a referenced Secret's labels (its pods could
# read the Secret anyway: this is what lets it refuse the unlabelled ones)
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
# read-only: the trainer's Role grants it (trainer ranks find each other), and RBAC lets the
# operator grant only what it holds itself
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
# list: a Pending checkpoint claim's provisioning events, named in the run's status
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch", "list"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
{{- if .Values.integrations.keda }}
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
{{- end }}
{{- if .Values.integrations.jobset }}
- apiGroups: ["jobset.x-k8s.io"]
  resources: ["jobsets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
{{- end }}
{{- if .Values.integrations.kueue }}
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- if .Values.integrations.prometheusOperator }}
- apiGroups: ["monitoring.coreos.com"]
  resources: ["servicemonitors", "podmonitors"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
{{- end }}
{{- if .Values.integrations.agentSandbox }}
- apiGroups: ["extensions.agents.x-k8s.io"]
  resources: ["sandboxtemplates", "sandboxwarmpools"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["extensions.agents.x-k8s.io"]
  resources: ["sandboxclaims"]
  verbs: ["create", "get", "list", "watch", "delete"]
- apiGroups: ["agents.x-k8s.io"]
  resources: ["sandboxes"]
  verbs: ["get"]
{{- end }}
{{- end }}

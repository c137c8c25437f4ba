{{/* Chart name, possibly overridden. */}}
{{- define "gfd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified name: the release name if it contains the chart name. */}}
{{- define "gfd.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of the kubelet plugin's objects (DaemonSet, ServiceAccount, ClusterRole...). */}}
{{- define "gfd.pluginName" -}}
{{- printf "%s-kubelet-plugin" (include "gfd.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gfd.serviceAccountName" -}}
{{- default (include "gfd.pluginName" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The username the API server gives the plugin's service account. */}}
{{- define "gfd.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "gfd.serviceAccountName" .) -}}
{{- end -}}

{{/* Labels of every namespaced and cluster-scoped object except the DeviceClasses, which
     carry only their own labels (templates/deviceclasses.yaml). */}}
{{- define "gfd.labels" -}}
app.kubernetes.io/name: {{ include "gfd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: gpu-fraction-dra
{{- end -}}

{{- define "gfd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gfd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: kubelet-plugin
{{- end -}}

{{- define "gfd.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) -}}
{{- end -}}
{{- end -}}

{{/* The driver name as a label value (as dra_driver.config.classnames.label_value). */}}
{{- define "gfd.driverLabel" -}}
{{- regexReplaceAll "[^A-Za-z0-9_.-]" .Values.driverName "-" | trunc 63 | trimAll "-_." | default "dra-driver" -}}
{{- end -}}

{{/* The node configuration document (YAML) for the ConfigMap. */}}
{{- define "gfd.nodeConfig" -}}
{{- $doc := deepCopy (.Values.nodeConfig | default dict) -}}
{{- $_ := set $doc "apiVersion" "gpu-fraction.dra.dev/v1alpha1" -}}
{{- $_ := set $doc "kind" "NodeConfig" -}}
{{- if .Values.slotsPerGpu -}}
{{- $_ := set $doc "slotsPerGpu" (int .Values.slotsPerGpu) -}}
{{- end -}}
{{- if .Values.extendedResources.enabled -}}
{{- $_ := set $doc "extendedResources" true -}}
{{- end -}}
{{- if .Values.products -}}
{{- $_ := set $doc "products" .Values.products -}}
{{- end -}}
{{- toYaml $doc -}}
{{- end -}}

{{/* Every product any GPU may offer, unique by name, defaults first (as
     NodeConfig.all_products), as a JSON list of {name, portion}. Without top-level products
     the plugin's built-in defaults apply, so their names are used. */}}
{{- define "gfd.allProducts" -}}
{{- $defaults := list (dict "name" "eighth" "portion" "1/8") (dict "name" "quarter" "portion" "1/4") (dict "name" "half" "portion" "1/2") (dict "name" "full" "portion" "1") -}}
{{- $all := list -}}
{{- $seen := dict -}}
{{- range (.Values.products | default $defaults) -}}
{{- if not (hasKey $seen .name) -}}
{{- $_ := set $seen .name true -}}
{{- $all = append $all (dict "name" .name "portion" (toString .portion)) -}}
{{- end -}}
{{- end -}}
{{- range ((.Values.nodeConfig | default dict).gpus | default list) -}}
{{- range (.products | default list) -}}
{{- if not (hasKey $seen .name) -}}
{{- $_ := set $seen .name true -}}
{{- $all = append $all (dict "name" .name "portion" (toString .portion)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $all -}}
{{- end -}}

{{/* Fail early on values the plugin or the policies would reject. */}}
{{- define "gfd.validate" -}}
{{- range .Values.fractionModels -}}
{{- if not (has . (list "products" "capacity")) -}}
{{- fail (printf "fractionModels: unknown model %q (known: products, capacity)" .) -}}
{{- end -}}
{{- end -}}
{{- range .Values.computeModes -}}
{{- if not (has . (list "time-slicing" "sm-sharing")) -}}
{{- fail (printf "computeModes: unknown mode %q (known: time-slicing, sm-sharing)" .) -}}
{{- end -}}
{{- end -}}
{{- $model := ((.Values.nodeConfig | default dict).defaults | default dict).fractionModel | default "products" -}}
{{- if not (has $model .Values.fractionModels) -}}
{{- fail (printf "nodeConfig.defaults.fractionModel %q is not in fractionModels %v" $model .Values.fractionModels) -}}
{{- end -}}
{{- range $key := list "smSharingComputeMode" "timeSlicingComputeMode" -}}
{{- $mode := index $.Values.mps $key -}}
{{- if not (has $mode (list "EXCLUSIVE_PROCESS" "DEFAULT")) -}}
{{- fail (printf "mps.%s: unknown NVML compute mode %q (known: EXCLUSIVE_PROCESS, DEFAULT)" $key $mode) -}}
{{- end -}}
{{- end -}}
{{- if not (has .Values.mps.service (list "separate" "in-plugin")) -}}
{{- fail (printf "mps.service: %q is neither separate nor in-plugin" .Values.mps.service) -}}
{{- end -}}
{{- if lt (int .Values.metricsPort) 0 -}}
{{- fail "metricsPort must be >= 0 (0: no metrics endpoint and no probes)" -}}
{{- end -}}
{{- end -}}

{{/* A portion ("a/b", "1" or a decimal such as "0.25") as the JSON list [numerator,
     denominator], reduced. */}}
{{- define "gfd.fraction" -}}
{{- $p := toString . -}}
{{- $num := 0 -}}
{{- $den := 1 -}}
{{- if contains "/" $p -}}
{{- $parts := splitList "/" $p -}}
{{- $num = index $parts 0 | int -}}
{{- $den = index $parts 1 | int -}}
{{- else if contains "." $p -}}
{{- $parts := splitList "." $p -}}
{{- $frac := index $parts 1 -}}
{{- $den = int (printf "1%s" (repeat (len $frac) "0")) -}}
{{- $num = add (mul (index $parts 0 | int) $den) (int (trimPrefix "0" $frac | default "0")) -}}
{{- else -}}
{{- $num = int $p -}}
{{- end -}}
{{- if le $den 0 -}}
{{- fail (printf "product portion %q: the denominator must be positive" $p) -}}
{{- end -}}
{{- $g := include "gfd.gcd" (list $num $den) | int -}}
{{- toJson (list (div $num $g) (div $den $g)) -}}
{{- end -}}

{{/* Greatest common divisor of two non-negative integers (Euclid; 64 rounds are plenty for
     the denominators a node configuration allows). */}}
{{- define "gfd.gcd" -}}
{{- $a := index . 0 | int -}}
{{- $b := index . 1 | int -}}
{{- range until 64 -}}
{{- if ne $b 0 -}}
{{- $r := mod $a $b -}}
{{- $a = $b -}}
{{- $b = $r -}}
{{- end -}}
{{- end -}}
{{- max $a 1 -}}
{{- end -}}

{{/* Slots per GPU: .Values.slotsPerGpu, or (unset) the least common multiple of every
     product's denominator, as the plugin computes it (NodeConfig.slots). */}}
{{- define "gfd.slotsPerGpu" -}}
{{- if .Values.slotsPerGpu -}}
{{- int .Values.slotsPerGpu -}}
{{- else -}}
{{- $l := 1 -}}
{{- range (include "gfd.allProducts" . | fromJsonArray) -}}
{{- $den := index (include "gfd.fraction" .portion | fromJsonArray) 1 | int -}}
{{- $g := include "gfd.gcd" (list $l $den) | int -}}
{{- $l = div (mul $l $den) $g -}}
{{- end -}}
{{- $l -}}
{{- end -}}
{{- end -}}

{{/* Slots a product of portion .portion takes of .slots; fails when that is not a whole
     number (as the plugin refuses it). */}}
{{- define "gfd.slotsOf" -}}
{{- $f := include "gfd.fraction" .portion | fromJsonArray -}}
{{- $num := index $f 0 | int -}}
{{- $den := index $f 1 | int -}}
{{- if ne (mod (mul $num .slots) $den) 0 -}}
{{- fail (printf "slotsPerGpu: %d slots cannot hold product %q (%s of a GPU) in whole slots" .slots .name (toString .portion)) -}}
{{- end -}}
{{- div (mul $num .slots) $den -}}
{{- end -}}

{{/* Every DeviceClass name of this driver: the ones the chart renders (products x modes,
     then the capacity classes; the names of templates/deviceclasses.yaml), then an admin's
     own (tenants.extraClasses), as a JSON list. */}}
{{- define "gfd.classNames" -}}
{{- $names := list -}}
{{- if has "products" .Values.fractionModels -}}
{{- range (include "gfd.allProducts" . | fromJsonArray) -}}
{{- $product := .name -}}
{{- range $.Values.computeModes -}}
{{- $names = append $names (ternary (printf "gpu-%s" $product) (printf "gpu-%s-%s" $product .) (eq . "time-slicing")) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if has "capacity" .Values.fractionModels -}}
{{- range .Values.computeModes -}}
{{- $names = append $names (ternary "gpu-memory" (printf "gpu-memory-%s" .) (eq . "time-slicing")) -}}
{{- end -}}
{{- end -}}
{{- range ((.Values.tenants | default dict).extraClasses | default list) -}}
{{- $names = append $names . -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{/* The label that grants a namespace this driver's devices (a cluster admin sets it). */}}
{{- define "gfd.tenantLabel" -}}
{{- printf "%s/tenant" .Values.driverName -}}
{{- end -}}

{{/* The ResourceQuota of a granted namespace, which the tenant-quota policy requires. */}}
{{- define "gfd.tenantQuotaName" -}}
{{- printf "%s-gpu-fractions" (include "gfd.fullname" .) -}}
{{- end -}}

{{/* Each DeviceClass of this driver with its product's portion, as a JSON list of
     {name, num, den} (den 0: a capacity class), in the order of gfd.classNames. */}}
{{- define "gfd.classInfo" -}}
{{- $out := list -}}
{{- if has "products" .Values.fractionModels -}}
{{- range (include "gfd.allProducts" . | fromJsonArray) -}}
{{- $product := .name -}}
{{- $f := include "gfd.fraction" .portion | fromJsonArray -}}
{{- range $.Values.computeModes -}}
{{- $out = append $out (dict "name" (ternary (printf "gpu-%s" $product) (printf "gpu-%s-%s" $product .) (eq . "time-slicing")) "num" (index $f 0) "den" (index $f 1)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if has "capacity" .Values.fractionModels -}}
{{- range .Values.computeModes -}}
{{- $out = append $out (dict "name" (ternary "gpu-memory" (printf "gpu-memory-%s" .) (eq . "time-slicing")) "num" 0 "den" 0) -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The caps of DeviceClass .name at admission (JSON {portion, bytes, threads, memoryCapped},
     "" where unset): its classLimits entry where that sets a memory cap, else the node's
     claimLimits; the thread cap likewise. */}}
{{- define "gfd.capsOf" -}}
{{- $node := (.root.Values.nodeConfig | default dict).claimLimits | default dict -}}
{{- $class := index (.root.Values.classLimits | default dict) .name | default dict -}}
{{- $level := $node -}}
{{- if or (hasKey $class "maxMemoryLimit") (hasKey $class "maxMemoryLimitPortion") -}}
{{- $level = $class -}}
{{- end -}}
{{- $threads := $class.maxActiveThreadPercentage | default $node.maxActiveThreadPercentage | default "" -}}
{{- toJson (dict "portion" (toString ($level.maxMemoryLimitPortion | default "")) "bytes" (toString ($level.maxMemoryLimit | default "")) "threads" (toString $threads) "memoryCapped" (or (hasKey $level "maxMemoryLimit") (hasKey $level "maxMemoryLimitPortion"))) -}}
{{- end -}}

{{- define "gfd.mpsSelectorLabels" -}}
app.kubernetes.io/name: {{ include "gfd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: mps-service
{{- end -}}
